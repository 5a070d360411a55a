"""Adapters to other ecosystems (TRL, OpenEnv), each behind an optional extra."""
