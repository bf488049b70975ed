"""`poolledger schema export DIR`: write the JSON Schema of every event type."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from schemas.config import SettingsLike
from schemas.events import PAYLOAD_TYPES, json_schema
from streams.log.files import atomic_file


def register(sub: Any) -> None:
    p = sub.add_parser("schema", help="the event contract as JSON Schema")
    ssub = p.add_subparsers(dest="schema_command", metavar="ACTION", required=True)
    e = ssub.add_parser("export", help="write one <type>.v<N>.schema.json per event type")
    e.add_argument("dir", type=Path, help="directory to write one JSON Schema file per event type into")
    e.set_defaults(func=export)


def export(args: argparse.Namespace, settings: SettingsLike) -> int:
    args.dir.mkdir(parents=True, exist_ok=True)
    for cls in PAYLOAD_TYPES:
        path = args.dir / f"{cls.TYPE}.v{cls.VERSION}.schema.json"
        with atomic_file(path) as f:
            f.write((json.dumps(json_schema(cls), indent=2, sort_keys=True) + "\n").encode())
    print(f"wrote {len(PAYLOAD_TYPES)} schemas to {args.dir}")
    return 0
