"""The test suite: a package, so pytest imports every module once (``tests.conftest``,
``tests.helpers``, ``tests.test_*``) and mypy checks it under the same names."""
