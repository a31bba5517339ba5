-- SPDX-License-Identifier: MIT
-- The lean scripts' load-time part (docs/redis.md, "Lean scripts"):
-- constants, functions and caches, and the functions that read and write
-- a key's word and state for lean.lua, over the call's state that
-- lean.lua sets at each call (below).  A lean driver includes it
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
-- word_in and word_out (below) take it for a 16-byte one, with no
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

-- The call's state, which lean.lua sets at each call before anything
-- below reads it: the key, Redis's TIME once read (tm, its reply; tms s,
-- tmu us; nil until then), the policy's numbers (num, id, fmt), the
-- key's version as read (cur_v: false for a new key; cur_top: it cannot
-- move on), the word's width (WB), the state's time t as {t_hi, t_lo}
-- and its word (w8 or w, as lean.lua reads them).  The functions over it
-- are made here, once, and not at each call (the closures and their
-- upvalues, made at each call, cost a tenth of the script).
local key, tm, tms, tmu, num, id, fmt, cur_v, cur_top
local WB, t_hi, t_lo, w, w8
-- the zeros before TIME's microseconds of 1 to 6 digits
local ZEROS = {'00000', '0000', '000', '00', '0', ''}

-- Two's complement of k = WB / 4 limbs, in place.
local function negate(l)
  local carry = 1
  for i = 1, WB / 4 do
    local v = 4294967295 - l[i] + carry
    if v == E32 then l[i] = 0 else l[i] = v; carry = 0 end
  end
end
-- The signed word (limbs l) divided by g (< 2^36), in 16-bit steps so
-- that each partial remainder stays below 2^52: the quotient, or nil if g
-- does not divide it or the quotient passes lim (the algorithm's
-- NAME_LEAN, <= 2^52) either way.
local function word_in(g, lim)
  if w8 ~= nil then
    -- w8 % g, exact but for one g either way (see fdiv)
    local r = w8 % g
    if r ~= 0 and r ~= g and r ~= -g then return nil end
    local q = w8 / g -- exact: g divides it
    if q > lim or q < -lim then return nil end
    return q
  end
  if WB == 8 then return word8_in(w[1], w[2], g, lim) end
  local l = w
  local neg = l[WB / 4] >= 2147483648
  if neg then negate(l) end
  local r, q = 0, 0
  for i = WB / 4, 1, -1 do
    local lo16 = math.fmod(l[i], 65536)
    for _, part in ipairs({(l[i] - lo16) / 65536, lo16}) do
      local cur = r * 65536 + part
      local qi = fdiv(cur, g)
      r = cur - qi * g
      q = q * 65536 + qi
      if q > lim then return nil end
    end
  end
  if r ~= 0 then return nil end
  if neg then return -q end
  return q
end
-- x * g (|x| <= 2^52, g < 2^36, and the product within the word's
-- width) as WB little-endian bytes, in 16-bit steps (each product below
-- 2^52, its carry below 2^37).
local function word_out(x, g)
  local m = x * g -- exact if below 2^53 either way (then so is the rounding)
  if WB == 8 and m > -9007199254740992 and m < 9007199254740992 then
    return struct.pack('<i8', m)
  end
  if WB == 8 then return struct.pack('<I4I4', word8_out(x, g)) end
  local neg = x < 0
  if neg then x = -x end
  local l, carry = {}, 0
  for i = 1, 4 do
    local lo = 0
    local hi = 0
    for k = 1, 2 do
      local xi = math.fmod(x, 65536)
      x = (x - xi) / 65536
      local p = xi * g + carry
      local limb = math.fmod(p, 65536)
      carry = (p - limb) / 65536
      if k == 1 then lo = limb else hi = limb end
    end
    l[i] = hi * 65536 + lo
  end
  if neg then negate(l) end
  if WB == 8 then return struct.pack('<I4I4', l[1], l[2]) end
  return struct.pack('<I4I4I4I4', l[1], l[2], l[3], l[4])
end

-- Writes the state (the header at t, then the word's bytes), moves the
-- version on and sets the expiry (reset: this decision's, in ns).
local function write(word, reset)
  local state = struct.pack('<I4I4I4BB', t_lo, t_hi, id, 1, fmt) .. word
  local ttl_us = num[1]
  if tms == nil and (cur_v == false or cur_top or ttl_us ~= 0) then
    tm = redis.call('TIME')
    tms, tmu = tonumber(tm[1]), tonumber(tm[2])
  end
  -- The version: a new key's from TIME in microseconds (below 2^53),
  -- written as TIME's seconds, then its microseconds in six digits;
  -- else the decimal string (at most 19 digits, checked above) plus one,
  -- digit by digit: tonumber of a long string costs more than the rest of
  -- the step.  Numbers go to Redis as strings made here: Redis formats a
  -- number argument with %.17g, several times the cost of %d.
  local ver
  if cur_v == false or cur_top then
    ver = tm[1] .. ZEROS[#tm[2]] .. tm[2]
  else
    ver = cur_v
    local i = #ver
    local b = string.byte(ver, i)
    if b ~= 57 then -- the common case: no carry
      ver = string.sub(ver, 1, i - 1) .. string.char(b + 1)
    else
      while i > 0 and string.byte(ver, i) == 57 do i = i - 1 end
      if i == 0 then ver = '1' .. string.rep('0', #ver)
      else
        ver = string.sub(ver, 1, i - 1) ..
              string.char(string.byte(ver, i) + 1) .. string.rep('0', #ver - i)
      end
    end
  end
  redis.call('HSET', key, 'v', ver, 's', state)
  if ttl_us == 0 then
    redis.call('PERSIST', key)
  else
    local us = ttl_us
    -- at least 1 (0 says none), as the client's ttl_us for the C step
    if us < 0 then us = cdiv(reset, 1000); if us < 1 then us = 1 end end
    if us > 2251799813685248 then us = 2251799813685248 end
    -- expire_at (step.lua): the end by Redis's clock, rounded up to
    -- whole milliseconds, plus one
    local e = tms * 1000000 + tmu + us
    local ms = cdiv(e, 1000)
    redis.call('PEXPIREAT', key, string.format('%d', ms + 1))
  end
end
