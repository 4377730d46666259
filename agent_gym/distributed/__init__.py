"""Scale-out on Ray (docs/DESIGN.md §1): env workers that the rollout collector drives like in-process envs.

`connect_ray` joins (or starts) a Ray cluster with its authentication and object store set on purpose;
`RayEnvPool` puts shards of envs in Ray actors behind the collector's `EnvBatch` interface, with dead or hung
workers restarted and their episodes dropped. Ray is imported only when these are used.
"""

from agent_gym.distributed.env_pool import EnvPoolError, EnvShard, RayEnvPool, ray_env_pool_factory
from agent_gym.distributed.ray_cluster import LOCAL_OBJECT_STORE_BYTES, RayClusterError, connect_ray

__all__ = [
    "LOCAL_OBJECT_STORE_BYTES",
    "EnvPoolError",
    "EnvShard",
    "RayClusterError",
    "RayEnvPool",
    "connect_ray",
    "ray_env_pool_factory",
]
