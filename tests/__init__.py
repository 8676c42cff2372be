"""The test suite: a package, so pytest imports every module once (``tests.conftest``,
``tests.helpers``, ``tests.wire.test_server``...) and mypy checks it under the same names.

Folders are layers, as the package's are: ``leaves`` (pure modules), ``package`` (its
surface and layering), ``engine`` (in memory), ``app`` (in process, the control plane),
``formats`` (other projects' fixtures), ``wire`` (real sockets), ``clients`` (official
SDKs and frameworks), ``system`` (the CLI, probe, the plugin, recording end to end).
Shared helpers stay at the top: helpers.py, memory.py (EnginePair), conftest.py."""
