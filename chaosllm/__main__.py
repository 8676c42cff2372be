"""`python -m chaosllm` is the `chaosllm` command."""

import sys

from chaosllm.cli import main

sys.exit(main())
