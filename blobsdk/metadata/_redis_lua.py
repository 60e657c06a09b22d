"""The Redis metadata store's Lua scripts (blobsdk/metadata/_redis.py): each runs atomically
on the server; their KEYS and ARGV are described at their heads."""

COMMIT = """
-- KEYS: n path keys, then n index keys, then n fence keys, then (a retryable commit) its
-- request's record key.  ARGV: now, then per op: path, if_version ('' for none), plan, size,
-- etag, chunks, its block ids joined by ','; then (with a record key) the record's TTL.
-- Returns {0, version...}, {-1, op index, live version}, {-3, op index, fenced block id} or
-- {-4, record} (the request was applied before: the JSON record of [now, versions, paths]).
local n = math.floor(#KEYS / 3)
local rec = false
if #KEYS > 3 * n then
  rec = KEYS[#KEYS]
  local done = redis.call('GET', rec)
  if done then return {-4, done} end
end
local now = ARGV[1]
local state = {}
local versions = {}
for i = 1, n do
  for id in string.gmatch(ARGV[2 + (i - 1) * 7 + 6], '[^,]+') do
    if redis.call('ZSCORE', KEYS[2 * n + i], id) then
      return {-3, i - 1, id}
    end
  end
end
for i = 1, n do
  local s = state[KEYS[i]]
  if s == nil then
    local cur = redis.call('HMGET', KEYS[i], 'v', 'etag')
    local last = tonumber(cur[1]) or 0
    local live = 0
    if cur[2] then live = last end
    s = {last, live}
    state[KEYS[i]] = s
  end
  local wanted = ARGV[2 + (i - 1) * 7 + 1]
  if wanted ~= '' and tonumber(wanted) ~= s[2] then
    return {-1, i - 1, s[2]}
  end
  s[1] = s[1] + 1
  s[2] = s[1]
  versions[i] = s[1]
end
for i = 1, n do
  local at = 2 + (i - 1) * 7
  local refs = string.sub(KEYS[n + i], 1, -4) .. 'b:'
  local old = redis.call('HGET', KEYS[i], 'blocks')
  if old then
    for id in string.gmatch(old, '[^,]+') do redis.call('ZREM', refs .. id, ARGV[at]) end
  end
  for id in string.gmatch(ARGV[at + 6], '[^,]+') do redis.call('ZADD', refs .. id, 0, ARGV[at]) end
  redis.call('HSET', KEYS[i], 'v', versions[i], 'plan', ARGV[at + 2], 'size', ARGV[at + 3],
             'etag', ARGV[at + 4], 'chunks', ARGV[at + 5], 't', now, 'blocks', ARGV[at + 6])
  redis.call('ZADD', KEYS[n + i], 0, ARGV[at])
end
if rec then
  local paths = {}
  for i = 1, n do paths[i] = ARGV[2 + (i - 1) * 7] end
  redis.call('SET', rec, cjson.encode({now, versions, paths}), 'EX', ARGV[#ARGV])
end
table.insert(versions, 1, 0)
return versions
"""

DELETE = """
-- KEYS: the path key, its index key, then (a retryable delete) its request's record key.
-- ARGV: path, if_version ('' for none), then (with a record key) the record's TTL.
-- Returns {-2} (no live version), {-1, live version}, {0, v, size, etag, chunks, t} or
-- {-4, record} (the request was applied before: the JSON record of [path, v, size, etag, chunks, t]).
if KEYS[3] then
  local done = redis.call('GET', KEYS[3])
  if done then return {-4, done} end
end
local cur = redis.call('HMGET', KEYS[1], 'v', 'size', 'etag', 'chunks', 't')
if not cur[3] then return {-2} end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= tonumber(cur[1]) then return {-1, tonumber(cur[1])} end
local old = redis.call('HGET', KEYS[1], 'blocks')
if old then
  local refs = string.sub(KEYS[2], 1, -4) .. 'b:'
  for id in string.gmatch(old, '[^,]+') do redis.call('ZREM', refs .. id, ARGV[1]) end
end
redis.call('HDEL', KEYS[1], 'plan', 'size', 'etag', 'chunks', 't', 'blocks')
redis.call('ZREM', KEYS[2], ARGV[1])
if KEYS[3] then
  redis.call('SET', KEYS[3], cjson.encode({ARGV[1], cur[1], cur[2], cur[3], cur[4], cur[5]}), 'EX', ARGV[3])
end
return {0, cur[1], cur[2], cur[3], cur[4], cur[5]}
"""

FENCE = """
-- KEYS: fence sets.  ARGV: the time, then block ids.  Adds every id to every set (score: time).
for k = 1, #KEYS do
  for i = 2, #ARGV do redis.call('ZADD', KEYS[k], 'NX', ARGV[1], ARGV[i]) end
end
return 0
"""

INDEX = """
-- KEYS: path keys.  ARGV: the refs prefix ('ns:{bucket}:b:'), then per key: path, etag,
-- block ids joined by ','.  Indexes each live path whose plan is still that etag and that
-- has no 'blocks' field yet (committed by a build before the reverse index).  Returns how many.
local done = 0
for i = 1, #KEYS do
  local at = 2 + (i - 1) * 3
  local cur = redis.call('HMGET', KEYS[i], 'etag', 'blocks')
  if cur[1] == ARGV[at + 1] and not cur[2] then
    for id in string.gmatch(ARGV[at + 2], '[^,]+') do redis.call('ZADD', ARGV[1] .. id, 0, ARGV[at]) end
    redis.call('HSET', KEYS[i], 'blocks', ARGV[at + 2])
    done = done + 1
  end
end
return done
"""


LIST = """
-- KEYS: a bucket's index.  ARGV: its path keys' stem ('ns:{bucket}:p:'), the ZRANGEBYLEX
-- bounds, count (paths to read), rows (how many of the first paths read to list).
-- Returns {cmsgpack array of a map of BlobInfo's fields per listed live path (the hash's
-- strings), the number of paths read, the last path of the first `rows` read (or false)}.
local paths = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[2], ARGV[3], 'LIMIT', 0, tonumber(ARGV[4]))
local rows = {}
local last = false
for i = 1, math.min(#paths, tonumber(ARGV[5])) do
  local f = redis.call('HMGET', ARGV[1] .. paths[i], 'v', 'size', 'etag', 'chunks', 't')
  if f[3] then
    rows[#rows + 1] = {path = paths[i], version = f[1], size = f[2], etag = f[3], chunks = f[4], created = f[5]}
  end
  last = paths[i]
end
return {cmsgpack.pack(rows), #paths, last}
"""
