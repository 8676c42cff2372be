"""The engine's stages, one module each, in the order `chaosllm.core.engine.Engine.handle`
runs them: `prepare` (the body parsed, bound, validated, redacted and digested), `match`
(a recording chosen, or the miss answered), `review` (the request checked against it, its
answer adapted), `render` (the exchange as a plan, at the pace asked), `limit` (the live
rate limit), `mint` (fresh ids for a recording served again), `fault` (the first armed
fault that fires transforms the plan), `shape` (chaosllm's headers and the modes'), and
`finish` (the one place a journal record is written, and the memo kept)."""
