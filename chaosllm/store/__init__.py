"""The store layer: recordings on disk and their formats, redaction and atomic writes, and the
matchers (exact, sequence, nearest) with their index. Pure but for reading and writing files."""
