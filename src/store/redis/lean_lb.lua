-- SPDX-License-Identifier: MIT
-- The lean leaky bucket's driver, one limit (docs/redis.md, "Lean
-- scripts"): the common part, then the rule (src/algo/leaky_bucket.lua)
-- over v = level * P in units of g.
-- ARGV [10] L/g, [11] P/g, [12] C (the capacity), [13] g
--@include src/store/redis/lean.lua
--@include src/algo/leaky_bucket.lua
local L, P, C, g = tonumber(ARGV[10]), tonumber(ARGV[11]),
                   tonumber(ARGV[12]), tonumber(ARGV[13])
local v
if st ~= nil then
  v = word_in(g, LEAKY_BUCKET_LEAN)
  if v == nil then return DECLINE end
end
v = leaky_bucket.load(v, P, C)
if v == nil then return DECLINE end
v = leaky_bucket.advance(v, dt, L)
if OP ~= '0' then
  local x = leaky_bucket.adjust(v, OP == '1' and 1 or 2, n, P, C)
  local remaining, reset = leaky_bucket.status(x, L, P, C)
  write(word_out(x, g), reset)
  return {1, 1, 0, 0, C, remaining, 0, 0, reset}
end
local ok, reason, delay, retry =
  leaky_bucket.decide(v, n, L, P, C, tonumber(ARGV[4]))
local x = v
if ok then x = leaky_bucket.commit(v, n, P) end
local remaining, reset = leaky_bucket.status(x, L, P, C)
if ok and n > 0 then write(word_out(x, g), reset) end
return {1, ok and 1 or 0, reason, 0, C, remaining, delay, retry, reset}
