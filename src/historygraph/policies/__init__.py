"""Context policies. Importing this package registers every built-in policy, then those of installed
plugins (entry point group ``historygraph.policies``), in :data:`historygraph.policies.base.REGISTRY`,
the single source of truth for policy names."""

from historygraph.policies import baselines, condensers, contextrender, contextweaver, handoff, learned, lingua, oracle, recap, recap_baselines, retrieval, windows  # noqa: F401  (registration side effects)
from historygraph.policies.base import (DEFAULT_POLICY, REGISTRY, Policy, PolicyError, Signals, check_production, config_fields, create, get_spec,
                   load_plugins, names)

load_plugins()  # policies of installed packages (entry point group "historygraph.policies")

__all__ = ["DEFAULT_POLICY", "REGISTRY", "Policy", "PolicyError", "Signals", "check_production", "config_fields", "create", "get_spec", "load_plugins", "names"]
