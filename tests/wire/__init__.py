"""The wire servers on real sockets: HTTP/1.1, every plan ending and fault as bytes,
quirks, refusals, capacity, fuzzing, and the same guarantees under uvicorn."""
