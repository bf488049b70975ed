"""GROUP_NAMES parsing and submitter-to-group mapping (seed 000, hierarchical group quotas)."""
from __future__ import annotations

import pytest

from streams.core.errors import CoreError
from streams.core.groups import ROOT, GroupTree, UnknownGroupError, is_nice_user, split_submitter

SEED = "group_physics, group_physics.hep, group_physics.lep, group_chemistry"


def test_parse_seed_group_names_sorted_with_root() -> None:
    t = GroupTree.from_names(SEED)
    assert t.names == ("group_chemistry", "group_physics", "group_physics.hep", "group_physics.lep")
    assert t.all_groups()[0] == ROOT
    assert t.warnings == ()


def test_separators_iterable_and_none() -> None:
    assert GroupTree.from_names("a b,c ,, d").names == ("a", "b", "c", "d")
    assert GroupTree.from_names(["b", " a "]).names == ("a", "b")
    assert GroupTree.from_names(None).names == ()
    assert GroupTree.from_names("").all_groups() == (ROOT,)


def test_case_insensitive_sort_duplicates_and_missing_parent() -> None:
    t = GroupTree.from_names("B, a, A, b.x, c.y, B.x.z")
    assert t.names == ("a", "B", "b.x", "B.x.z")
    assert len(t.warnings) == 2
    assert any("duplicate" in w and "A" in w for w in t.warnings)
    assert any("c.y" in w and "no parent" in w for w in t.warnings)
    assert "A" in t and "b.X.Z" in t and "c.y" not in t
    assert t.canonical("b") == "B"


def test_parent_children_ancestors() -> None:
    t = GroupTree.from_names(SEED)
    assert t.parent("group_physics.hep") == "group_physics"
    assert t.parent("GROUP_PHYSICS") == ROOT
    assert t.parent(ROOT) is None
    assert t.children(ROOT) == ("group_chemistry", "group_physics")
    assert t.children("group_physics") == ("group_physics.hep", "group_physics.lep")
    assert t.ancestors("group_physics.hep") == ("group_physics", ROOT)
    assert t.ancestors(ROOT) == ()
    with pytest.raises(UnknownGroupError) as exc:
        t.parent("nope")
    assert isinstance(exc.value, CoreError)


def test_split_submitter() -> None:
    assert split_submitter("g1.g2.user@dom") == ("g1.g2", "user", "dom")
    assert split_submitter("alice@example.org") == (None, "alice", "example.org")
    assert split_submitter("nice-user.bob@d") == ("nice-user", "bob", "d")
    assert split_submitter("a.b@x@y") == ("a", "b@x", "y")
    assert split_submitter("plain") == (None, "plain", "")


def test_group_of_deepest_defined_ancestor() -> None:
    t = GroupTree.from_names(SEED)
    assert t.group_of("group_physics.hep.higgs@example.org") == "group_physics.hep"
    assert t.group_of("GROUP_Physics.HEP.higgs@example.org") == "group_physics.hep"
    assert t.group_of("group_physics.einstein@example.org") == "group_physics"
    assert t.group_of("group_physics.qcd.gluon@example.org") == "group_physics"
    assert t.group_of("group_bio.darwin@example.org") == ROOT
    assert t.group_of("alice@example.org") == ROOT


def test_nice_user_group() -> None:
    assert is_nice_user("nice-user.bob@d") and not is_nice_user("bob@d")
    assert GroupTree.from_names(SEED).group_of("nice-user.bob@d") == ROOT
    assert GroupTree.from_names("nice-user").group_of("nice-user.bob@d") == "nice-user"
