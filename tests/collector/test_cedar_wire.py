"""CEDAR values and ads without a network: what the server reads is what the client wrote,
in old ClassAd syntax, and malformed input fails with a reason naming what is wrong."""
from __future__ import annotations

import classad2
import pytest

from services.collector.cedar import ProtocolError, Reader, Writer, parse_lines


@pytest.mark.parametrize("encrypted", [False, True])
def test_ad_round_trip_keeps_old_syntax_strings(encrypted: bool) -> None:
    ad = classad2.ClassAd({"Path": "C:\\Users\\x", "Quote": 'say "hi"', "Lines": "a\nb", "N": 3,
                           "F": 2.5, "B": True})
    ad["Req"] = classad2.ExprTree("Cpus > 2 && Memory >= 1024")
    data = Writer(encrypted).integer(7).ad(ad).payload()
    reader = Reader(data, encrypted)
    assert reader.integer() == 7
    back, private = reader.ad(100)
    reader.done()
    assert private is None
    assert dict(back.items()).keys() == dict(ad.items()).keys()
    for name in ("Path", "Quote", "Lines", "N", "F", "B"):
        assert back[name] == ad[name]
    assert str(back.lookup("Req")) == str(ad.lookup("Req"))


@pytest.mark.parametrize("encrypted", [False, True])
def test_private_attributes_are_set_apart(encrypted: bool) -> None:
    writer = Writer(encrypted).integer(4)
    writer.string('Name = "slot1@x"').string("ZKM").string('Secret = "s3"')
    writer.string('ClaimId = "<1.2.3.4>#1"').string('_condor_privKey = "k"').string("").string("")
    public, private = Reader(writer.payload(), encrypted).ad(100)
    assert dict(public) == {"Name": "slot1@x"}
    assert private is not None and dict(private) == {"Secret": "s3", "ClaimId": "<1.2.3.4>#1",
                                                     "_condor_privKey": "k"}


def test_malformed_values_name_the_problem() -> None:
    with pytest.raises(ProtocolError, match="more than 10"):
        Reader(Writer(False).integer(11).payload(), False).ad(10)
    with pytest.raises(ProtocolError, match="negative number of attributes"):
        Reader(Writer(False).integer(-1).payload(), False).ad(10)
    with pytest.raises(ProtocolError, match="no terminating NUL"):
        Reader(Writer(False).integer(1).payload() + b"A = 1", False).ad(10)
    with pytest.raises(ProtocolError, match="a string of 99 bytes is cut short"):
        Reader(Writer(True).integer(1).integer(99).payload() + b"A = 1", True).ad(10)
    with pytest.raises(ProtocolError, match="unexpected bytes"):
        reader = Reader(Writer(False).integer(1).integer(2).payload(), False)
        reader.integer()
        reader.done()
    with pytest.raises(ProtocolError, match="attribute Bad does not parse"):
        parse_lines([b"Good = 1", b"Bad = (((", b"Also = 2"])
    with pytest.raises(ProtocolError, match="not `Name = expression`"):
        parse_lines([b"no equals sign here"])


def test_duplicate_names_keep_the_last_value() -> None:
    assert dict(parse_lines([b"A = 1", b"a = 2"])) in ({"a": 2}, {"A": 2})


@pytest.mark.parametrize("encrypted", [False, True])
def test_bulk_query_framing_equals_one_ad_at_a_time(encrypted: bool) -> None:
    from services.collector.cedar import ad_lines, encode_query_ads
    from services.collector.port import RenderedAd

    ads = []
    for i in range(200):
        attrs: dict = {"Name": f"slot{i}@x", "Cpus": i, "Path": "C:\\a\\", "Q": 'x"y'}
        if i % 37 == 0:
            attrs["Note"] = "two\nlines"  # framed alone
        ads.append(classad2.ClassAd({} if i % 50 == 0 else attrs))
    ads += [RenderedAd(tuple(ad_lines(ad))) for ad in ads[:60]]  # a backend's pre-rendered ads
    reference = Writer(encrypted)
    for ad in ads:
        reference.integer(1).ad(ad)
    assert encode_query_ads(ads, encrypted) == reference.payload()
