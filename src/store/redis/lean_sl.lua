-- SPDX-License-Identifier: MIT
-- The lean sliding log's driver, one limit (docs/redis.md, "Lean
-- scripts"): the common part, then the rule (src/algo/sliding_log.lua)
-- over the byte and time helpers it reads its entries with, made here the
-- lean way.  The state's component is C's: count u32, sum u32, then count
-- entries (time u64, permits u64), oldest first; lean.lua reads the
-- header and checks it is at least those 8 bytes (the width 0 the client
-- sends), this driver that the entries fill the rest exactly.
-- num [5] L, [6] W (ns, at most SLIDING_LOG_LEAN, 2^51), as the client's
-- gate (lean_of) sends them.
--@include src/store/redis/lean_lib.lua

-- A time is a number here: its distance in ns from the call's t (base_hi,
-- base_lo, set at each call), exact within 2^20 * 2^32 ns (more than
-- twice SLIDING_LOG_LEAN) either way and +-math.huge beyond, which
-- compares with every time the rule forms (t, t - W) as the time itself
-- does.  An entry at 2^63 ns or more (never written: a tampered state) is
-- nil, as in the general step, and declines.  (struct is there at each
-- call, not when the Functions library loads.)
local base_hi, base_lo = 0, 0
local function u32(s, i) return (struct.unpack('<I4', s, i)) end
local function u64(s, i, lim) -- nil at lim (<= 2^52) or more
  local lo, hi = struct.unpack('<I4I4', s, i)
  local x = hi * E32 + lo
  if x >= lim then return nil end
  return x
end
local function get_t(s, i)
  local lo, hi = struct.unpack('<I4I4', s, i)
  if hi >= 2147483648 then return nil end
  local dh = hi - base_hi
  if dh >= 1048576 then return math.huge end
  if dh <= -1048576 then return -math.huge end
  return dh * E32 + (lo - base_lo)
end
local function put_t(x) -- |x| < 2^52, the time >= 0
  local lo = base_lo + x
  local r = lo % E32
  return struct.pack('<I4I4', r, base_hi + (lo - r) / E32)
end
local function put64(x) return struct.pack('<i8', x) end -- 0 <= x < 2^53
local function put32(x) return struct.pack('<I4', x) end
local function tcmp(a, b)
  if a < b then return -1 end
  if a > b then return 1 end
  return 0
end
local function tdiff(a, b) return a - b end
local function tminus(a, d) -- a - d; nil when that is before the clock's zero
  if base_hi < 1048576 and (base_hi * E32 + base_lo) + a - d < 0 then
    return nil
  end
  return a - d
end
--@include src/algo/sliding_log.lua
local LAST = 6
--@call
--@include src/store/redis/lean.lua
local L, W = num[5], num[6]
if num[4] ~= 0 or L < 1 or L >= SLIDING_LOG_STEP or W < 1 or
   W > SLIDING_LOG_LEAN then
  return DECLINE
end
base_hi, base_lo = t_hi, t_lo
local v, off = sl_load(st, 15, L)
if v == nil or (st ~= nil and off ~= #st + 1) or
   not sl_advance(st, v, 0, W) then
  return DECLINE
end
if OP ~= '0' then
  -- as C's step_adjust: the entries checked first, then the change
  if st ~= nil and not sl_valid(st, v, l_lo, l_hi) then return DECLINE end
  local m = sl_adjust(v, OP == '1' and 1 or 2, n, L)
  local remaining, reset = sl_status(st, v, L, W, 0, m)
  if remaining == nil then return DECLINE end
  write(sl_commit(st, v, m, 0), reset)
  return {1, 1, 0, 0, L, remaining, 0, 0, reset}
end
local ok, reason, delay, retry = sl_decide(st, v, n, L, W, 0)
if ok == nil then return DECLINE end
local admit = ok and n > 0
local remaining, reset = sl_status(st, v, L, W, 0, admit and n or 0)
if remaining == nil then return DECLINE end
if admit then
  -- the entries kept checked in full (as C's sl_view_ok) before written
  if st ~= nil and not sl_valid(st, v, l_lo, l_hi) then return DECLINE end
  write(sl_commit(st, v, n, 0), reset)
end
return {1, ok and 1 or 0, reason, 0, L, remaining, delay, retry, reset}
