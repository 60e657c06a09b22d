"""blobsdk/_redisurl.py: the Redis URL forms every setting and flag that names Redis takes,
and the exact refusal of each bad one."""

from __future__ import annotations

import pytest

from blobsdk._redisurl import FORM, SentinelURL, check_redis_url, is_sentinel, sentinel_url
from blobsdk.config import ClientConfig, ReadConfig


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("redis+sentinel://10.0.0.1:26379/blobsdk", SentinelURL((("10.0.0.1", 26379),), "blobsdk", 0, None, None, False)),
        (
            "redis+sentinel://a:1,b:2,c/meta/3",
            SentinelURL((("a", 1), ("b", 2), ("c", 26379)), "meta", 3, None, None, False),
        ),
        (
            "rediss+sentinel://u:p%40ss@[::1]:5000,[fe80::1]/m/",
            SentinelURL((("::1", 5000), ("fe80::1", 26379)), "m", 0, "u", "p@ss", True),
        ),
        ("redis+sentinel://:secret@h:1/m/0", SentinelURL((("h", 1),), "m", 0, None, "secret", False)),
    ],
)
def test_a_sentinel_url_names_its_sentinels_service_database_and_login(url, parsed):
    assert check_redis_url(url, "x") == url
    assert is_sentinel(url)
    assert sentinel_url(url) == parsed


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///x", f"metadata_url must be {FORM}, got 'sqlite:///x'"),
        ("redis://", f"metadata_url must be {FORM}, got 'redis://'"),
        ("redis+sentinel://h:1", f"metadata_url must be {FORM}, got 'redis+sentinel://h:1'"),
        ("redis+sentinel:///m", f"metadata_url must be {FORM}, got 'redis+sentinel:///m'"),
        ("redis+sentinel://h/m/0/1", f"metadata_url must be {FORM}, got 'redis+sentinel://h/m/0/1'"),
        ("redis+sentinel://h/m/db", "metadata_url: the database must be a number, got 'db' in 'redis+sentinel://h/m/db'"),
        (
            "redis+sentinel://h:0/m",
            "metadata_url: a Sentinel's address is HOST:PORT, got 'h:0' in 'redis+sentinel://h:0/m'",
        ),
        (
            "redis+sentinel://h:1,,g:2/m",
            "metadata_url: a Sentinel's address is HOST:PORT, got '' in 'redis+sentinel://h:1,,g:2/m'",
        ),
        (
            "redis+sentinel://[::1]x/m",
            "metadata_url: a Sentinel's address is HOST:PORT, got '[::1]x' in 'redis+sentinel://[::1]x/m'",
        ),
    ],
)
def test_a_bad_redis_url_is_refused_naming_the_setting(url, message):
    with pytest.raises(ValueError) as caught:
        check_redis_url(url, "metadata_url")
    assert str(caught.value) == message


def test_every_setting_that_names_redis_takes_a_sentinel_url():
    url = "redis+sentinel://s1:26379,s2:26379/blobsdk/0"
    config = ClientConfig(metadata_url=url, block_urls=("http://127.0.0.1:1",), read=ReadConfig(shared_plan_cache_url=url))
    assert config.metadata_url == url
    with pytest.raises(ValueError) as caught:
        ReadConfig(shared_plan_cache_url="redis+sentinel://s1")
    assert str(caught.value) == f"[read] shared_plan_cache_url must be {FORM}, got 'redis+sentinel://s1'"
