"""ResourcePool: a set of devices (CPU slots or GPUs) reserved in Ray, that one or more worker groups run on.

Reservation: one bundle per device ({"CPU": c} or {"GPU": 1, "CPU": c}), and one STRICT_PACK placement
group per node holding that node's bundles (as upstream verl does). Why this shape:
- STRICT_SPREAD over one bundle per device would demand a distinct machine per device: wrong as soon as a
  node has more than one device.
- A single PACK group may split one node's devices over several machines wherever Ray finds room, so which
  ranks share a machine (and its NVLink, for tensor parallelism) would be unknown until placed.
- One bundle per node (e.g. {"GPU": 8}) would not pin a fractional request to one device: Ray packs
  fractional GPU requests first-fit, so two 0.5-GPU actors of one group could land on the same GPU.
Ray does not promise that two of a pool's per-node groups land on different machines; it only puts them
together when one machine has room for both, which is harmless. LOCAL_RANK is therefore computed from where
the bundles actually landed, not from the requested node index.

Colocation: worker groups built on the same ResourcePool object share its bundles. Each asks for a fraction of
every bundle (ray_group(..., resource_fraction=0.5) for two groups), so rank r of each group runs on the same
device. Ranks are numbered node-major: node 0's devices first, as in verl.config.placement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup  # pants: no-infer-dep (the ray extra)

    from verl.config.plan import Plan

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Slot:
    """Where one rank of a pool lives: a bundle of a placement group, on a node."""

    rank: int
    placement_group: PlacementGroup
    bundle_index: int
    node_id: str
    local_rank: int  # position among the pool's ranks on the same node
    local_world_size: int  # the pool's ranks on that node


@dataclass
class ResourcePool:
    """`nnodes` x `devices_per_node` devices of one type, reserved lazily in Ray by `slots()`.

    `node_devices` gives the devices taken on each node when that is not `devices_per_node` everywhere
    (a pool that starts or ends partway through a node, see `pools_from_plan`).
    """

    name: str
    nnodes: int
    devices_per_node: int
    device: str = "cpu"
    cpus_per_device: float = 1.0  # CPUs reserved with each device (with each worker slot on CPU pools)
    node_devices: tuple[int, ...] | None = None
    _slots: list[Slot] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"ResourcePool '{self.name}'"
        for key in ("nnodes", "devices_per_node"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"{where}: {key} must be an int >= 1, got {getattr(self, key)!r}")
        if self.device not in DEVICES:
            raise ValueError(f"{where}: device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.cpus_per_device < 0 or (self.device == "cpu" and self.cpus_per_device == 0):
            raise ValueError(
                f"{where}: cpus_per_device must be > 0 on a cpu pool (>= 0 on cuda), got {self.cpus_per_device}"
            )
        if self.node_devices is not None:
            self.node_devices = tuple(self.node_devices)
            if len(self.node_devices) != self.nnodes or not all(
                1 <= n <= self.devices_per_node for n in self.node_devices
            ):
                raise ValueError(
                    f"{where}: node_devices={self.node_devices} must have nnodes={self.nnodes} entries, "
                    f"each between 1 and devices_per_node={self.devices_per_node}"
                )

    @property
    def node_sizes(self) -> tuple[int, ...]:
        """Devices on each node of the pool."""
        return self.node_devices if self.node_devices is not None else (self.devices_per_node,) * self.nnodes

    @property
    def world_size(self) -> int:
        return sum(self.node_sizes)

    def bundle(self) -> dict[str, float]:
        """The Ray resources reserved for one device."""
        if self.device == "cuda":
            return {"GPU": 1.0, "CPU": float(self.cpus_per_device)}
        return {"CPU": float(self.cpus_per_device)}

    def slots(self, timeout_s: float = 600.0) -> list[Slot]:
        """One slot per rank, in rank order; reserves the placement groups on first use (waits up to timeout_s)."""
        if self._slots is None:
            import ray  # pants: no-infer-dep (the ray extra); imported here: a run without Ray never pays for it

            if not ray.is_initialized():  # else Ray would start a default cluster on its own
                raise RuntimeError(
                    f"ResourcePool '{self.name}': Ray is not running; call verl.controller.init_ray() first "
                    "(or use the local controller, trainer.controller=local)"
                )
            self._slots = _slots_of(self._reserve(timeout_s))
        return list(self._slots)

    def remove(self) -> None:
        """Release the reservation (worker groups on this pool should be shut down first)."""
        for pg in dict.fromkeys(slot.placement_group for slot in self._slots or []):  # each node's group once
            from ray.util.placement_group import remove_placement_group  # pants: no-infer-dep (the ray extra)

            remove_placement_group(pg)
        self._slots = None

    def _reserve(self, timeout_s: float) -> list[PlacementGroup]:
        import importlib

        import ray  # pants: no-infer-dep (the ray extra)

        # (the module: ray.util's attribute of that name is the function)
        groups_api = importlib.import_module("ray.util.placement_group")

        # Unnamed: Ray requires placement group names to be unique, and two runs may use the same pool name.
        groups = [groups_api.placement_group([self.bundle()] * n, strategy="STRICT_PACK") for n in self.node_sizes]
        _, pending = ray.wait([pg.ready() for pg in groups], num_returns=len(groups), timeout=timeout_s)
        if pending:
            states = [groups_api.placement_group_table(pg)["stats"]["scheduling_state"] for pg in groups]
            for pg in groups:
                groups_api.remove_placement_group(pg)
            raise RuntimeError(
                f"ResourcePool '{self.name}': could not reserve {self.nnodes} node(s) with {list(self.node_sizes)} "
                f"bundles of {self.bundle()} within {timeout_s:.0f} s (placement group states: {states}); the "
                f"cluster has {ray.cluster_resources()} in total and {ray.available_resources()} free. "
                "Shrink the pool (devices_per_node, cpus_per_device), free resources, or add nodes"
            )
        return groups


def _slots_of(groups: list[PlacementGroup]) -> list[Slot]:
    placed = []  # (placement group, bundle index, node id) in rank order
    for pg in groups:
        table = _wait_for_table(pg)
        placed += [(pg, j, table["bundles_to_node_id"][j]) for j in range(len(table["bundles"]))]
    per_node: dict[str, int] = {}
    local_ranks = []
    for _, _, node in placed:
        local_ranks.append(per_node.get(node, 0))
        per_node[node] = local_ranks[-1] + 1
    return [Slot(rank, pg, j, node, local_ranks[rank], per_node[node]) for rank, (pg, j, node) in enumerate(placed)]


def _wait_for_table(pg: PlacementGroup, timeout_s: float = 10.0) -> dict:
    """The placement group's table once every bundle has a node (the table can lag `ready()` briefly)."""
    from ray.util.placement_group import placement_group_table  # pants: no-infer-dep (the ray extra)

    deadline = time.monotonic() + timeout_s
    while True:
        table = placement_group_table(pg)
        if len(table.get("bundles_to_node_id", {})) == len(table["bundles"]) or time.monotonic() > deadline:
            return table
        time.sleep(0.05)


def pools_from_plan(plan: Plan, cpus_per_device: float = 1.0) -> dict[str, ResourcePool]:
    """A ResourcePool for each pool of a placement plan that holds an enabled role, by pool name.

    The plan numbers devices node-major and gives each pool a run of consecutive ranks; a run that starts
    or ends partway through a node becomes `node_devices`. The trainer builds one worker group per worker
    class on the pool of its roles (`plan.pool(role).name`), and colocated groups share the pool object.
    """
    pools = {}
    dpn = plan.devices_per_node
    for pool in plan.pools:
        if not pool.roles:
            continue
        first_node, last_node = pool.nodes(dpn)
        sizes = tuple(len([r for r in pool.ranks if r // dpn == node]) for node in range(first_node, last_node + 1))
        uneven = any(size != dpn for size in sizes)
        pools[pool.name] = ResourcePool(
            name=pool.name,
            nnodes=len(sizes),
            devices_per_node=dpn,
            device=plan.device,
            cpus_per_device=cpus_per_device,
            node_devices=sizes if uneven else None,
        )
    return pools
