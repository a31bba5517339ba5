-- SPDX-License-Identifier: MIT
-- The lean scripts' pure part (docs/redis.md, "Lean scripts"): constants
-- and functions that read no call's arguments.  A lean driver includes it
-- and its algorithm's rule first, then a line "--@call", then lean.lua and
-- its own body.  In the Functions library (FCALL) what comes before that
-- line runs once, when the library loads, and the caches below live as
-- long as it; by EVALSHA the whole text runs at each call and the caches
-- start empty, with the same results.
--@include lua_range.lua
local E32 = 4294967296
local DECLINE = {0}
-- floor(a / b), 0 <= a < 2^53, 0 < b < 2^53, with no library call (each
-- costs as much as a dozen operations): Lua's a % b is a - floor(a / b) *
-- b in doubles, off by at most one b when a / b rounds, and exact once
-- corrected, as is the division of a - r that follows.
local function fdiv(a, b)
  local r = a % b
  if r < 0 then r = r + b elseif r >= b then r = r - b end
  return (a - r) / b
end
local function cdiv(a, b)
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- A time's offset in its window of W ns (windows aligned to the clock's
-- zero), t = hi * 2^32 + lo: (hi * 2^32 mod W + lo) mod W, the first by
-- math.fmod (exact for any doubles), the second below 2^53 by % corrected
-- as fdiv does.  The windows' drivers (lean_fw.lua, lean_sw.lua).
local function offset(hi, lo, W)
  local r = (math.fmod(hi * E32, W) + lo) % W
  if r < 0 then r = r + W elseif r >= W then r = r - W end
  return r
end


-- A whole second s (a decimal string, s < 2^34) as nanoseconds {hi, lo}
-- (t = hi * 2^32 + lo): with s = a * 2^32 + b, s * 10^9 = (a * 5^9 *
-- 2^9) * 2^32 + (b * 5^9) * 2^9, each product exact below 2^53.  Returns
-- s as a number and the two halves, or nil for no such s.  The last
-- second's are kept: Redis's TIME gives the same one for a second.
local secs_str, secs_s, secs_hi, secs_lo
local function secs_ns(str)
  if str ~= secs_str then
    local s = tonumber(str)
    if s == nil or s >= 17179869184 then return nil end
    local sb = s % E32 -- exact: s < 2^34, and so for Y < 2^53
    local Y = sb * 1953125
    local yl = Y % 8388608
    secs_hi = (s - sb) / E32 * 1000000000 + (Y - yl) / 8388608
    secs_lo = yl * 512
    secs_s, secs_str = s, str
  end
  return secs_s, secs_hi, secs_lo
end

-- The policy's numbers (lean.lua's ARGV[6]: decimals, one space apart)
-- as a table, or nil unless there are exactly `last` of them: tonumber
-- (strtod) of each costs more than most of the step, and they are the
-- same from call to call of a policy.  Kept by the exact string they
-- were read from (Lua's strings are interned: the look-up hashes no
-- bytes).  At most NUMS_MAX strings: past that, the cache starts over.
local NUMS_MAX = 1024
local nums_cache, nums_count = {}, 0
local function nums(str, last)
  local e = nums_cache[str]
  if e ~= nil then return e end
  e = {}
  local i = 0
  for word in string.gmatch(str, '[^ ]+') do
    i = i + 1
    e[i] = tonumber(word)
    if e[i] == nil then return nil end
  end
  if i ~= last then return nil end
  if nums_count >= NUMS_MAX then nums_cache, nums_count = {}, 0 end
  nums_count = nums_count + 1
  nums_cache[str] = e
  return e
end

-- An 8-byte word past 2^53 (its 32-bit limbs lo, hi; signed), as
-- lean.lua's word_in and word_out take it for a 16-byte one, with no
-- table and no library call: nonnegative integers below 2^53 split at a
-- power of two with % exactly.  The two's complement of {lo, hi}:
local function neg64(lo, hi)
  if lo == 0 then return 0, (E32 - hi) % E32 end
  return E32 - lo, 4294967295 - hi
end
-- The word divided by g (< 2^36) in 16-bit steps, each partial remainder
-- below 2^52: the quotient, or nil if g does not divide it or the
-- quotient passes lim either way.
local function word8_in(lo, hi, g, lim)
  local neg = hi >= 2147483648
  if neg then lo, hi = neg64(lo, hi) end
  local lo16, hi16 = lo % 65536, hi % 65536
  local cur = (hi - hi16) / 65536
  local q = fdiv(cur, g)
  cur = (cur - q * g) * 65536 + hi16
  local qi = fdiv(cur, g)
  q = q * 65536 + qi
  cur = (cur - qi * g) * 65536 + (lo - lo16) / 65536
  qi = fdiv(cur, g)
  q = q * 65536 + qi
  cur = (cur - qi * g) * 65536 + lo16
  qi = fdiv(cur, g)
  q = q * 65536 + qi
  if cur - qi * g ~= 0 or q > lim then return nil end
  if neg then return -q end
  return q
end
-- x * g (|x| <= 2^52, g < 2^36) as 32-bit limbs lo, hi of the 8-byte
-- word, in 16-bit steps (each product below 2^52, its carry below 2^37).
local function word8_out(x, g)
  local neg = x < 0
  if neg then x = -x end
  local x0 = x % 65536
  x = (x - x0) / 65536
  local x1 = x % 65536
  x = (x - x1) / 65536
  local x2 = x % 65536
  local x3 = (x - x2) / 65536
  local p = x0 * g
  local l0 = p % 65536
  p = x1 * g + (p - l0) / 65536
  local l1 = p % 65536
  p = x2 * g + (p - l1) / 65536
  local l2 = p % 65536
  p = x3 * g + (p - l2) / 65536
  local lo, hi = l1 * 65536 + l0, p % 65536 * 65536 + l2
  if neg then return neg64(lo, hi) end
  return lo, hi
end
