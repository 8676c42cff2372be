"""The testing toolkit: the pytest plugin, hypothesis strategies, resilience checks, and probe."""
