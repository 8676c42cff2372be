"""Fixture formats other projects write (hash-keyed, traces, VCR cassettes, DocsGPT's and
IronClaw's), their registry, `chaosllm import` and what `doctor` says about them."""
