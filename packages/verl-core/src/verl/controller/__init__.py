"""The single controller: resource pools, worker groups and how calls on them are dispatched to workers."""

from verl.controller.dispatch import Dispatch, register
from verl.controller.errors import WorkerError
from verl.controller.ray_cluster import init_ray, shutdown_ray
from verl.controller.resource_pool import ResourcePool, pools_from_plan
from verl.controller.worker import Worker
from verl.controller.worker_group import CallStats, WorkerGroup, local_group, make_worker_group, ray_group

__all__ = [
    "CallStats",
    "Dispatch",
    "ResourcePool",
    "Worker",
    "WorkerError",
    "WorkerGroup",
    "init_ray",
    "local_group",
    "make_worker_group",
    "pools_from_plan",
    "ray_group",
    "register",
    "shutdown_ray",
]
