-- SPDX-License-Identifier: MIT
-- Sliding log in Lua: the rule of sliding_log.c for the Redis scripts, in
-- the shape of the C table (rate__algo_t), its
-- members as local functions sl_NAME (as in sliding_log.c): load, advance, decide, status,
-- valid (sl_view_ok), adjust and commit.  Unlike the other pieces it reads its
-- entries from the state bytes itself, with its driver's byte and time
-- helpers (u32, u64, get_t, put_t, put32, put64, tcmp, tdiff, tminus),
-- which hold a time as they like: the general step as {s, ns} pairs, the
-- lean sliding log (src/store/redis/lean_sl.lua) as its distance from
-- the call's t (cmake/lua_script.cmake).
--
-- The component: count u32, sum u32, then count entries (time u64,
-- permits u64), oldest first.  A view: {base, first, count, sum}, the
-- entries from `first` (0-based) on being those inside the window, sum
-- their permits.  Every number stays below SLIDING_LOG_STEP or declines.
-- What is checked where follows sliding_log.c: in constant time on load,
-- the entries a read touches as it goes, and the whole window's entries
-- (valid) only before an admission writes them back.

-- The component at off (st nil: a new key) under a limit of L: the view
-- and the offset after it, or nil (declined) when the counts or the
-- length cannot be this library's (count <= sum <= L, and the entries
-- there).
local function sl_load(st, off, L)
  if st == nil then return {base = off, first = 0, count = 0, sum = 0}, off end
  if #st < off + 7 then return nil end
  local count, sum = u32(st, off), u32(st, off + 4)
  if sum > L or count > sum or #st < off + 7 + count * 16 then return nil end
  return {base = off + 8, first = 0, count = count, sum = sum},
         off + 8 + count * 16
end

-- Drops the entries at or before t - W (a binary search, then their
-- permits subtracted): false (declined) on an entry's time or permits out
-- of range, or a running sum below zero (a tampered log).
local function sl_advance(st, v, t, W)
  if v.count == 0 then return true end
  local lo, hi = 0, v.count
  local cut = tminus(t, W)
  if cut ~= nil then
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      local et = get_t(st, v.base + mid * 16)
      if et == nil then return false end
      if tcmp(et, cut) <= 0 then lo = mid + 1 else hi = mid end
    end
  end
  for i = 0, lo - 1 do
    local en = u64(st, v.base + i * 16 + 8, SLIDING_LOG_STEP)
    if en == nil then return false end
    v.sum = v.sum - en
    if v.sum < 0 then return false end
  end
  v.first = lo
  return true
end

-- When entry i, inside the window, leaves it: W - (t - time), in (0, W];
-- nil for a time out of that range (a tampered entry, whose answer C
-- computes in unsigned arithmetic: declined).
local function sl_left(st, v, i, t, W)
  local et = get_t(st, v.base + i * 16)
  if et == nil then return nil end
  local e = W - tdiff(t, et)
  if e <= 0 or e > W then return nil end
  return e
end

-- ok, reason (0 ok, 1 limited, 2 never), delay (always 0), retry (-1:
-- never; else when enough of the oldest entries have left); nil:
-- declined (an entry out of range on the way).
local function sl_decide(st, v, n, L, W, t)
  if n > L then return false, 2, 0, -1 end
  if n == 0 or v.sum + n <= L then return true, 0, 0, 0 end
  local s = v.sum
  for i = v.first, v.count - 1 do
    local en = u64(st, v.base + i * 16 + 8, SLIDING_LOG_STEP)
    if en == nil then return nil end
    s = s - en
    if s < 0 then return nil end
    if s + n <= L then
      local retry = sl_left(st, v, i, t, W)
      if retry == nil then return nil end
      return false, 1, 0, retry
    end
  end
  return false, 1, 0, 0
end

-- remaining and reset (ns until the newest entry leaves) of the view
-- with n more permits admitted at t (0: as it is); nil: declined.
local function sl_status(st, v, L, W, t, n)
  local remaining = 0
  if v.sum + n < L then remaining = L - v.sum - n end
  if n > 0 then return remaining, W end
  if v.count - v.first == 0 then return remaining, 0 end
  local reset = sl_left(st, v, v.count - 1, t, W)
  if reset == nil then return nil end
  return remaining, reset
end

-- The entries still in the window, in full (sl_view_ok), before an
-- admission writes them back: each of 1..L permits, times non-decreasing
-- and none after t_last (last_lo, last_hi: its 32-bit halves), their sum
-- the pruned sum.  Linear in the log, as copying it is, so kept lean:
-- struct.unpack reads an entry in one call, its time as two 32-bit halves
-- (compared high, then low; exact) and its permits as one 64-bit number
-- (a double, exact up to 2^53, and never rounded down to L or below); an
-- entry above L needs no test of its own, since entries of at least 1
-- each then sum past L >= the pruned sum; nor does every time against
-- t_last, once they are in order: the newest does.
local function sl_valid(st, v, last_lo, last_hi)
  local phi, plo, total = 0, 0, 0
  local pos = v.base + v.first * 16
  local unpack = struct.unpack
  for _ = v.first + 1, v.count do
    local tlo, thi, p
    tlo, thi, p, pos = unpack('<I4I4I8', st, pos)
    if p < 1 or thi < phi or (thi == phi and tlo < plo) then return false end
    total = total + p
    phi, plo = thi, tlo
  end
  return total == v.sum and (phi < last_hi or (phi == last_hi and plo <= last_lo))
end

-- A refund (op 1) takes back n permits, at most the view's sum: v.trim,
-- which sl_commit drops from the newest entries, logging nothing (0); a
-- penalty (op 2): the permits to log at t, as many as fit under L.
local function sl_adjust(v, op, n, L)
  if op == 1 then
    local trim = v.sum
    if n < trim then trim = n end
    v.trim, v.sum = trim, v.sum - trim
    return 0
  end
  if v.sum >= L then return 0 end
  if n < L - v.sum then return n end
  return L - v.sum
end

-- The component after logging n at t: the kept entries, copied once
-- (then once more by the driver's concatenation), less a refund's trim
-- (the newest entries dropped or cut down; n is then 0), and either the
-- newest entry's permits raised (an entry at t already) or a new entry.
local function sl_commit(st, v, n, t)
  local kept = v.count - v.first
  local from, to = v.base + v.first * 16, v.base + v.count * 16 - 1
  local tail = ''
  local trim = v.trim or 0
  if trim > 0 then
    while trim > 0 and kept > 0 do
      local last = u64(st, to - 7, SLIDING_LOG_STEP)
      if last <= trim then
        kept, to, trim = kept - 1, to - 16, trim - last
      else
        tail, to, trim = put64(last - trim), to - 8, 0
      end
    end
  elseif n == 0 then
    -- nothing to log
  elseif kept > 0 and tcmp(get_t(st, to - 15), t) == 0 then
    tail = put64(u64(st, to - 7, SLIDING_LOG_STEP) + n)
    to = to - 8
  else
    tail = put_t(t) .. put64(n)
    kept = kept + 1
  end
  local kept_bytes = ''
  if to >= from then kept_bytes = string.sub(st, from, to) end
  return put32(kept) .. put32(v.sum + n) .. kept_bytes .. tail
end
