"""Context policies. Importing this package registers every built-in policy in
:data:`historygraph.policies.base.REGISTRY`, the single source of truth for policy names."""

from . import baselines, condensers, contextrender, contextweaver, learned, oracle, recap, recap_baselines, retrieval, windows  # noqa: F401  (registration side effects)
from .base import REGISTRY, Policy, PolicyError, Signals, check_production, config_fields, create, get_spec, names

__all__ = ["REGISTRY", "Policy", "PolicyError", "Signals", "check_production", "config_fields", "create", "get_spec", "names"]
