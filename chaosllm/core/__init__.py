"""The core: the pure engine that turns a provider call and the server's state into a decision
(a plan or a proxy instruction and a typed journal record), with the journal and the oracles.
It imports no server library (a test says so)."""
