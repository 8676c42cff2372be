"""Compatibility plug-ins: behaviours that only some fixture formats or modes need, each
registered at the engine's named extension points (`chaosllm.core.hooks`) by a module of
its own: `docsgpt` (DocsGPT's mock LLM over hash-keyed fixtures), `ironclaw` (trace
fixtures' checks and bindings), `structured` (structured outputs re-validated)."""
