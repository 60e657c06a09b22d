import pytest

from blobsdk.cache.base import validate_key
from blobsdk.chunks.ids import is_hex32, validate_hex32
from blobsdk.errors import BadRequest
from blobsdk.sources.base import new_block_id, validate_block_id

GOOD = "0123456789abcdef" * 2


def test_hex32_is_exactly_32_lowercase_hex_digits():
    assert is_hex32(GOOD) and is_hex32(new_block_id())
    for bad in ("", GOOD[:-1], GOOD + "0", GOOD.upper(), GOOD[:-1] + "g", GOOD[:-1] + "\n", f" {GOOD[1:]}"):
        assert not is_hex32(bad), bad


@pytest.mark.parametrize("value", [GOOD.upper(), 7, None, GOOD.encode()])
def test_validators_name_what_they_refuse(value: object):
    for validate, what in ((validate_key, "chunk key"), (validate_block_id, "block id")):
        with pytest.raises(BadRequest) as caught:
            validate(value)
        assert str(caught.value) == f"invalid {what} {value!r}: want 32 lowercase hex digits"
    assert validate_key(GOOD) is validate_block_id(GOOD) is validate_hex32(GOOD, "x") is GOOD
