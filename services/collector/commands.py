"""HTCondor's collector command numbers: per command its family, MyType and authorization level.

From HTCondor's `src/condor_includes/condor_commands.h` (numbers) and
`src/condor_collector.V6/collector.cpp` (the level each handler is registered with);
GET_PRIORITY from the negotiator's `matchmaker.cpp`, DC_NOP from daemon core.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["update", "invalidate", "query", "query-multiple", "priority", "nop"]

DC_AUTHENTICATE = 60010
DC_NOP = 60011
DC_SEC_QUERY = 60040


@dataclass(frozen=True, slots=True)
class Command:
    number: int
    name: str
    family: Family
    #: HTCondor's MyType of the ads it carries or asks for (None: QUERY_MULTIPLE_ADS, priority, nop)
    ad_type: str | None
    #: the authorization level its handler is registered with
    level: str
    #: whether the client sends a payload after the command (an ad)
    payload: bool = True
    #: whether the collector acknowledges the update (an integer 1 in a message of its own)
    ack: bool = False


def _c(number: int, name: str, family: Family, ad_type: str | None, level: str,
       payload: bool = True, ack: bool = False) -> Command:
    return Command(number, name, family, ad_type, level, payload, ack)


COMMANDS: dict[int, Command] = {c.number: c for c in (
    # updates
    _c(0, "UPDATE_STARTD_AD", "update", "Machine", "ADVERTISE_STARTD"),
    _c(1, "UPDATE_SCHEDD_AD", "update", "Scheduler", "ADVERTISE_SCHEDD"),
    _c(2, "UPDATE_MASTER_AD", "update", "DaemonMaster", "ADVERTISE_MASTER"),
    _c(4, "UPDATE_CKPT_SRVR_AD", "update", "CkptServer", "DAEMON"),
    _c(11, "UPDATE_SUBMITTOR_AD", "update", "Submitter", "ADVERTISE_SCHEDD"),
    _c(19, "UPDATE_COLLECTOR_AD", "update", "Collector", "DAEMON"),
    _c(42, "UPDATE_LICENSE_AD", "update", "License", "DAEMON"),
    _c(45, "UPDATE_STORAGE_AD", "update", "Storage", "DAEMON"),
    _c(49, "UPDATE_NEGOTIATOR_AD", "update", "Negotiator", "NEGOTIATOR"),
    _c(55, "UPDATE_HAD_AD", "update", "HAD", "DAEMON"),
    _c(58, "UPDATE_AD_GENERIC", "update", "Generic", "DAEMON"),
    _c(70, "UPDATE_GRID_AD", "update", "Grid", "DAEMON"),
    _c(77, "UPDATE_ACCOUNTING_AD", "update", "Accounting", "NEGOTIATOR"),
    _c(80, "UPDATE_OWN_SUBMITTOR_AD", "update", "Submitter", "DAEMON"),
    _c(60, "UPDATE_STARTD_AD_WITH_ACK", "update", "Machine", "ADVERTISE_STARTD", ack=True),
    # invalidations
    _c(13, "INVALIDATE_STARTD_ADS", "invalidate", "Machine", "ADVERTISE_STARTD"),
    _c(14, "INVALIDATE_SCHEDD_ADS", "invalidate", "Scheduler", "ADVERTISE_SCHEDD"),
    _c(15, "INVALIDATE_MASTER_ADS", "invalidate", "DaemonMaster", "ADVERTISE_MASTER"),
    _c(17, "INVALIDATE_CKPT_SRVR_ADS", "invalidate", "CkptServer", "DAEMON"),
    _c(18, "INVALIDATE_SUBMITTOR_ADS", "invalidate", "Submitter", "ADVERTISE_SCHEDD"),
    _c(21, "INVALIDATE_COLLECTOR_ADS", "invalidate", "Collector", "DAEMON"),
    _c(44, "INVALIDATE_LICENSE_ADS", "invalidate", "License", "DAEMON"),
    _c(47, "INVALIDATE_STORAGE_ADS", "invalidate", "Storage", "DAEMON"),
    _c(51, "INVALIDATE_NEGOTIATOR_ADS", "invalidate", "Negotiator", "NEGOTIATOR"),
    _c(57, "INVALIDATE_HAD_ADS", "invalidate", "HAD", "DAEMON"),
    _c(59, "INVALIDATE_ADS_GENERIC", "invalidate", "Generic", "DAEMON"),
    _c(72, "INVALIDATE_GRID_ADS", "invalidate", "Grid", "DAEMON"),
    _c(79, "INVALIDATE_ACCOUNTING_ADS", "invalidate", "Accounting", "NEGOTIATOR"),
    # queries
    _c(5, "QUERY_STARTD_ADS", "query", "Machine", "READ"),
    _c(6, "QUERY_SCHEDD_ADS", "query", "Scheduler", "READ"),
    _c(7, "QUERY_MASTER_ADS", "query", "DaemonMaster", "READ"),
    _c(9, "QUERY_CKPT_SRVR_ADS", "query", "CkptServer", "READ"),
    _c(10, "QUERY_STARTD_PVT_ADS", "query", "Machine", "NEGOTIATOR"),
    _c(12, "QUERY_SUBMITTOR_ADS", "query", "Submitter", "READ"),
    _c(20, "QUERY_COLLECTOR_ADS", "query", "Collector", "READ"),
    _c(43, "QUERY_LICENSE_ADS", "query", "License", "READ"),
    _c(46, "QUERY_STORAGE_ADS", "query", "Storage", "READ"),
    _c(48, "QUERY_ANY_ADS", "query", "Any", "READ"),
    _c(50, "QUERY_NEGOTIATOR_ADS", "query", "Negotiator", "READ"),
    _c(56, "QUERY_HAD_ADS", "query", "HAD", "READ"),
    _c(71, "QUERY_GRID_ADS", "query", "Grid", "READ"),
    _c(74, "QUERY_GENERIC_ADS", "query", "Generic", "READ"),
    _c(78, "QUERY_ACCOUNTING_ADS", "query", "Accounting", "READ"),
    _c(53, "QUERY_MULTIPLE_ADS", "query-multiple", None, "READ"),
    _c(54, "QUERY_MULTIPLE_PVT_ADS", "query-multiple", None, "NEGOTIATOR"),
    # the negotiator's priorities (condor_userprio), and daemon core's no-op
    _c(451, "GET_PRIORITY", "priority", None, "READ", payload=False),
    _c(514, "GET_PRIORITY_ROLLUP", "priority", None, "READ", payload=False),
    _c(DC_NOP, "DC_NOP", "nop", None, "ALLOW", payload=False),
)}


def command(number: int) -> Command | None:
    return COMMANDS.get(number)

