-- SPDX-License-Identifier: MIT
-- The lean leaky bucket's driver, one limit (docs/redis.md, "Lean
-- scripts"): the common part, then the rule (src/algo/leaky_bucket.lua)
-- over v = level * P in units of g.
-- num (the policy's numbers) [5] L/g, [6] P/g, [7] C (the capacity), [8] g
--@include src/store/redis/lean_lib.lua
--@include src/algo/leaky_bucket.lua
local LAST = 8
--@call
--@include src/store/redis/lean.lua
local L, P, C, g = num[5], num[6], num[7], num[8]
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
