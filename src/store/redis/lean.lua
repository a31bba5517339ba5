-- SPDX-License-Identifier: MIT
-- The lean scripts' common part (docs/redis.md, "Lean scripts"): each of
-- lean_tb.lua, lean_lb.lua, lean_fw.lua includes lean_lib.lua and its
-- algorithm's rule (src/algo/NAME.lua), then this text, as one script
-- (LAST, the driver's, is its last argument's index) that decides
-- one single-limit policy of its algorithm over the same state bytes as
-- src/step.c (header: t_last u64, tag u32, count u8, format u8; then the
-- limit's one word, 8 bytes or a wide bucket's 16), or declines ({0},
-- nothing written) and the client decides through the compare-and-set
-- path.  The build assembles them (cmake/lua_script.cmake).
--
-- Numbers are doubles, exact below 2^53.  A time in nanoseconds is not, so
-- times are kept as two 32-bit halves {hi, lo} (t = hi * 2^32 + lo), read
-- and written with struct, and only differences (below 2^52) and offsets
-- in a window (math.fmod, which is exact) are ever numbers.  A bucket's
-- word u (tokens or level, times P) is read in units of g, a common
-- divisor of L and P below 2^36 chosen by the client: every quantity the
-- step forms is then a multiple of g, divided out exactly, so that an hour
-- or a day at a large burst stays below 2^51 (the algorithm's NAME_LEAN,
-- rate__algo_t's lua_lean, which the build writes into the constants
-- included first: cmake/lua_range.cmake).  A word that is no multiple of
-- g (a state carried over from another policy) declines.
--
-- KEYS[1]  the key (a hash: v = version, s = state bytes)
-- ARGV     [1] [2] now as seconds and nanoseconds (both "": Redis's TIME),
--          [3] permits, [4] max_wait (ns), [5] the operation (0 a
--          decision, 1 a refund, 2 a penalty), [6] the policy's numbers
--          in one argument, decimals one space apart (LAST of them, read
--          into num once per policy: lean_lib.lua's nums): [1] ttl (0:
--          none, -1: this decision's reset_after, else microseconds), [2]
--          policy id (the state's tag), [3] format (2 or 3), [4] the
--          word's width in bytes (8 or 16), then the algorithm's from [5]
-- returns  as step.lua: {1, allowed, reason, 0, limit, remaining,
--          delay, retry (-1: never), reset}, {0} declined, {2} WRONGTYPE;
--          a refund or a penalty: {1, 1, 0, 0, limit, remaining, 0, 0,
--          reset} of the state it wrote (the client reads none of it)

-- now: {hi, lo}, from Redis's TIME or the caller's (s, ns): the whole
-- second's halves (secs_ns, in lean_lib.lua) plus the nanoseconds.
local tms, tmu, now_hi, now_lo -- Redis's TIME, once read: s, us
if ARGV[1] == '' then
  local tm = redis.call('TIME')
  tms, now_hi, now_lo = secs_ns(tm[1])
  tmu = tonumber(tm[2])
  now_lo = now_lo + tmu * 1000
else
  tms, now_hi, now_lo = secs_ns(ARGV[1])
  local sub = tonumber(ARGV[2])
  if tms == nil or sub == nil then return DECLINE end
  now_lo = now_lo + sub
  tms = nil -- the caller's time: Redis's is read when writing
end
if now_lo >= E32 then now_lo = now_lo - E32; now_hi = now_hi + 1 end
-- The policy's numbers (nums, in lean_lib.lua); ARGV[4] (max_wait) is
-- read where it is needed.
local n = 1
if ARGV[3] ~= '1' then n = tonumber(ARGV[3]) end
local num = nums(ARGV[6], LAST)
if num == nil then return DECLINE end
local id, fmt = num[2], num[3]

--@include src/store/redis/read_state.lua

-- The state's header and word: t = max(now, t_last) as {t_hi, t_lo}, dt =
-- t - t_last (math.huge from 2^52 ns on: 52 days, past every bucket's
-- refill and every window), t_last's halves {l_hi, l_lo} and the word:
-- w8, a number, when it is 8 bytes below 2^53 either way (the common
-- case, read in the same struct.unpack as the header), else its 32-bit
-- limbs, low first, in w (all nil: a new key).  WB (num[4]) is the
-- word's width in bytes: 8, or 16 for a wide bucket (B * P > 2^62); 0
-- for a sliding log's 8 bytes and its entries after them (its driver
-- checks their length).
local WB = 8
if num[4] == 16 then WB = 16 end
local t_hi, t_lo, dt, w, w8 = now_hi, now_lo, 0, nil, nil
local l_hi, l_lo
if st ~= nil then
  if #st ~= 14 + WB and (num[4] ~= 0 or #st < 14 + WB) then
    return DECLINE
  end
  local tag, count, f, pos
  if WB == 8 then
    -- the word as one signed number too: exact when below 2^53 either way
    l_lo, l_hi, tag, count, f, w8, pos = struct.unpack('<I4I4I4BBi8', st)
  else
    l_lo, l_hi, tag, count, f, pos = struct.unpack('<I4I4I4BB', st)
  end
  if tag ~= id or count ~= 1 or f ~= fmt or l_hi >= 2147483648 then
    return DECLINE -- another policy or format, or a t_last past 2^63
  end
  if w8 == nil or w8 <= -9007199254740992 or w8 >= 9007199254740992 then
    w8 = nil
    if WB == 8 then w = {struct.unpack('<I4I4', st, 15)}
    else w = {struct.unpack('<I4I4I4I4', st, 15)} end
  end
  if l_hi > now_hi or (l_hi == now_hi and l_lo > now_lo) then
    t_hi, t_lo = l_hi, l_lo
  end
  if t_hi - l_hi >= 1048576 then dt = math.huge
  else dt = (t_hi - l_hi) * E32 + (t_lo - l_lo) end
end

-- A refund or a penalty (docs/algorithms.md, "Changes outside an
-- admission"; src/step.c step_adjust): the state at t changed by the
-- algorithm's rule (its piece's adjust) and written as of t, expiring
-- after the changed state's reset as the C step's does.  A refund of a key
-- with no state has nothing to give back: nothing is written.
local OP = ARGV[5]
if OP ~= '0' and OP ~= '1' and OP ~= '2' then return DECLINE end
if OP == '1' and st == nil then return {1, 1, 0, 0, 0, 0, 0, 0, 0} end

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
  if tms == nil and (cur[1] == false or vtop or ttl_us ~= 0) then
    local tm = redis.call('TIME')
    tms, tmu = tonumber(tm[1]), tonumber(tm[2])
  end
  -- The version: a new key's from TIME in microseconds (below 2^53);
  -- else the decimal string (at most 19 digits, checked above) plus one,
  -- digit by digit: tonumber of a long string costs more than the rest of
  -- the step.  Numbers go to Redis as strings made here: Redis formats a
  -- number argument with %.17g, several times the cost of %d.
  local ver
  if cur[1] == false or vtop then
    ver = string.format('%d', tms * 1000000 + tmu)
  else
    ver = cur[1]
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
  redis.call('HSET', KEYS[1], 'v', ver, 's', state)
  if ttl_us == 0 then
    redis.call('PERSIST', KEYS[1])
  else
    local us = ttl_us
    -- at least 1 (0 says none), as the client's ttl_us for the C step
    if us < 0 then us = cdiv(reset, 1000); if us < 1 then us = 1 end end
    if us > 2251799813685248 then us = 2251799813685248 end
    -- expire_at (step.lua): the end by Redis's clock, rounded up to
    -- whole milliseconds, plus one
    local e = tms * 1000000 + tmu + us
    local ms = cdiv(e, 1000)
    redis.call('PEXPIREAT', KEYS[1], string.format('%d', ms + 1))
  end
end
