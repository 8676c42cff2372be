"""chaosllm as users run it: the CLI and ChaosServer, probe, the pytest plugin, doctor,
and recording through the proxy end to end."""
