-- SPDX-License-Identifier: MIT
-- The lean leaky bucket's driver, one limit (docs/redis.md, "Lean
-- scripts"): the common part, then the rule (src/algo/leaky_bucket.lua)
-- over v = level * P in units of g.
-- ARGV [10] L/g, [11] P/g, [12] C (the capacity), [13] g
--@include src/store/redis/lean_lib.lua
--@include src/algo/leaky_bucket.lua
local LAST = 13
--@call
--@include src/store/redis/lean.lua
local L, P, C, g = num[10], num[11], num[12], num[13]
local v
if st ~= nil then
  v = word_in(g, LEAKY_BUCKET_LEAN)
  if v == nil then return DECLINE end
end
v = lb_load(v, P, C)
if v == nil then return DECLINE end
v = lb_advance(v, dt, L)
if OP ~= '0' then
  local x = lb_adjust(v, OP == '1' and 1 or 2, n, P, C)
  local remaining, reset = lb_status(x, L, P, C)
  write(word_out(x, g), reset)
  return {1, 1, 0, 0, C, remaining, 0, 0, reset}
end
local ok, reason, delay, retry =
  lb_decide(v, n, L, P, C, ARGV[4] == '0' and 0 or tonumber(ARGV[4]))
local x = v
if ok then x = lb_commit(v, n, P) end
local remaining, reset = lb_status(x, L, P, C)
if ok and n > 0 then write(word_out(x, g), reset) end
return {1, ok and 1 or 0, reason, 0, C, remaining, delay, retry, reset}
