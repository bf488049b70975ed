"""A simulated HTCondor pool (startds, schedds) on a virtual clock, emitting PoolLedger events.

`PoolSim(load_scenario(path), random.Random(seed))` builds the pool of a scenario file;
`advance_to`, `apply_match`, `idle_jobs` and `slot_ads` are the whole interface.
"""
from services.pool.errors import (ClockError, MatchError, PoolConfigError, PoolError,
                                  ScenarioError, SlotConfigError)
from services.pool.scenario import Scenario, load_scenario, parse_scenario
from services.pool.schedd import JobView, submitter_name
from services.pool.sim import PoolSim

__all__ = ["PoolSim", "Scenario", "load_scenario", "parse_scenario", "JobView", "submitter_name",
           "PoolError", "ScenarioError", "SlotConfigError", "PoolConfigError", "MatchError",
           "ClockError"]
