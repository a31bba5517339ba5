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
-- (tm, tms, tmu: Redis's TIME, once read; lean_lib.lua's call state)
local now_hi, now_lo
key = KEYS[1]
if ARGV[1] == '' then
  tm = redis.call('TIME')
  tms, now_hi, now_lo = secs_ns(tm[1])
  tmu = tonumber(tm[2])
  now_lo = now_lo + tmu * 1000
else
  tms, now_hi, now_lo = secs_ns(ARGV[1])
  local sub = tonumber(ARGV[2])
  if tms == nil or sub == nil then return DECLINE end
  now_lo = now_lo + sub
  tms, tmu = nil, nil -- the caller's time: Redis's is read when writing
end
if now_lo >= E32 then now_lo = now_lo - E32; now_hi = now_hi + 1 end
-- The policy's numbers (nums, in lean_lib.lua); ARGV[4] (max_wait) is
-- read where it is needed.
local n = 1
if ARGV[3] ~= '1' then n = tonumber(ARGV[3]) end
num = nums(ARGV[6], LAST)
if num == nil then return DECLINE end
id, fmt = num[2], num[3]

--@include src/store/redis/read_state.lua
cur_v, cur_top = cur[1], vtop

-- The state's header and word: t = max(now, t_last) as {t_hi, t_lo}, dt =
-- t - t_last (math.huge from 2^52 ns on: 52 days, past every bucket's
-- refill and every window), t_last's halves {l_hi, l_lo} and the word:
-- w8, a number, when it is 8 bytes below 2^53 either way (the common
-- case, read in the same struct.unpack as the header), else its 32-bit
-- limbs, low first, in w (all nil: a new key).  WB (num[4]) is the
-- word's width in bytes: 8, or 16 for a wide bucket (B * P > 2^62); 0
-- for a sliding log's 8 bytes and its entries after them (its driver
-- checks their length).
WB = 8
if num[4] == 16 then WB = 16 end
local dt, l_hi, l_lo = 0, nil, nil
t_hi, t_lo, w, w8 = now_hi, now_lo, nil, nil
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
