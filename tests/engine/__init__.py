"""The engine's behaviour, in memory (tests/memory.py's EnginePair) and where it shows
through a server: matching, fault schedules and predicates, rate limits, verdicts, pace,
re-asks, failure classes, oracles and bounds."""
