"""Context policies. Importing this package registers every built-in policy, then those of installed
plugins (entry point group ``historygraph.policies``), in :data:`historygraph.policies.registry.REGISTRY`,
the single source of truth for policy names."""

from historygraph.policies import contextrender, oracle  # noqa: F401  (registration side effects)
from historygraph.policies.baselines import clearing, condensers, full_prune, handoff, lingua, retrieval, windows  # noqa: F401
from historygraph.policies.contextweaver import policy as _contextweaver  # noqa: F401
from historygraph.policies.learned import policy as _learned  # noqa: F401
from historygraph.policies.recap import baselines as _recap_baselines, policy as _recap  # noqa: F401
from historygraph.policies import cache_stable  # noqa: F401  (wraps the policies above)
from historygraph.policies.base import Policy, PolicyError, Signals
from historygraph.policies.registry import DEFAULT_POLICY, REGISTRY, check_production, config_fields, create, get_spec, load_plugins, names

load_plugins()  # policies of installed packages (entry point group "historygraph.policies")

__all__ = ["DEFAULT_POLICY", "REGISTRY", "Policy", "PolicyError", "Signals", "check_production", "config_fields", "create", "get_spec", "load_plugins", "names"]
