-- SPDX-License-Identifier: MIT
-- The lean token bucket's driver, one limit (docs/redis.md, "Lean
-- scripts"): the common part, then the rule (src/algo/token_bucket.lua)
-- over u = tokens * P in units of g.
-- num (the policy's numbers) [5] L/g, [6] P/g, [7] B, [8] g, [9] the debt
-- bound 2^62 / g, rounded down (a reservation may not take u below it, as
-- in C)
--@include src/store/redis/lean_lib.lua
--@include src/algo/token_bucket.lua
local LAST = 9
--@call
--@include src/store/redis/lean.lua
local L, P, B, g = num[5], num[6], num[7], num[8]
local debt = num[9]
local u
if st ~= nil then
  -- (|u| <= 2^51 here: below the debt bound only when it is below 2^51)
  u = word_in(g, TOKEN_BUCKET_LEAN)
  if u == nil then return DECLINE end
end
u = tb_load(u, P, B, debt)
if u == nil then return DECLINE end
u = tb_advance(u, dt, L, P, B)
if OP ~= '0' then
  -- a penalty past TOKEN_BUCKET_LEAN (in units of g) or the debt bound
  -- declines (the C step clamps it): every number here stays exact
  local x = tb_adjust(u, OP == '1' and 1 or 2, n, P, B, debt,
                                TOKEN_BUCKET_LEAN)
  if x == nil then return DECLINE end
  local remaining, reset = tb_status(x, L, P, B)
  write(word_out(x, g), reset)
  return {1, 1, 0, 0, B, remaining, 0, 0, reset}
end
local ok, reason, delay, retry =
  tb_decide(u, n, L, P, B, ARGV[4] == '0' and 0 or tonumber(ARGV[4]), debt)
local x = u
if ok then x = tb_commit(u, n, P) end
local remaining, reset = tb_status(x, L, P, B)
if ok and n > 0 then write(word_out(x, g), reset) end
return {1, ok and 1 or 0, reason, 0, B, remaining, delay, retry, reset}
