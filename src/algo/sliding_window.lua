-- SPDX-License-Identifier: MIT
-- Sliding window counter in Lua: the rule of sliding_window.c for the
-- Redis scripts, in the shape of the C table (rate__algo_t), its
-- members as local functions sw_NAME (as in sliding_window.c): load,
-- advance, decide, commit, adjust and status.  A driver includes this file
-- (cmake/lua_script.cmake) and finds the windows around it: how far t is
-- from t_last's window (roll) and e, t's offset in its window of W ns.
--
-- prev, curr: the permits counted in the previous and the current
-- window, each at most L.  C compares used = prev * (W - e) + curr * W
-- with L * W; here curr is moved to the right-hand side first, so that
-- no number formed passes L * W (prev * (W - e) against (L - curr) * W):
-- exact while the driver's gate keeps L * W at most 2^52
-- (SLIDING_WINDOW_STEP, _LEAN).  Uses the driver's fdiv.  The general
-- step and the lean sliding window include it.

-- The stored counts (nil: a new key) as a view; nil when this library
-- never writes them (a count past the limit).
local function sw_load(prev, curr, L)
  if prev == nil then return 0, 0 end
  if prev > L or curr > L then return nil end
  return prev, curr
end

-- The counts at t: roll 0 when t is in t_last's window, 1 in the next
-- one (the current count becomes the previous), 2 later (both gone).
local function sw_advance(prev, curr, roll)
  if roll == 0 then return prev, curr end
  if roll == 1 then return curr, 0 end
  return 0, 0
end

-- (L - curr) * W - prev * (W - e): L * W less the estimate scaled by W
-- (C's cap - used), for curr <= L; each product at most L * W.
local function sw_room(prev, curr, L, W, e)
  return (L - curr) * W - prev * (W - e)
end

-- ok, reason (0 ok, 1 limited, 2 never), delay (always 0), retry (-1:
-- never; else the first time the weighted estimate lets n pass: within
-- this window as prev's weight falls, or in the next one).
local function sw_decide(prev, curr, n, L, W, e)
  if n > L then return false, 2, 0, -1 end
  if n == 0 or
     (curr + n <= L and sw_room(prev, curr + n, L, W, e) >= 0) then
    return true, 0, 0, 0
  end
  local d = nil
  if curr + n <= L and prev > 0 then
    local q = fdiv((L - curr - n) * W, prev)
    if q > 0 and q <= W then
      local e1 = W - q
      if e1 > e then d = e1 - e end
    elseif q > W then d = 0 end
  end
  if d == nil then
    local e2 = 0
    if curr > 0 then
      local q = fdiv((L - n) * W, curr)
      if q >= W then e2 = 0 else e2 = W - q end
    end
    d = (W - e) + e2
  end
  return false, 1, 0, d
end

-- The counts after admitting n.
local function sw_commit(prev, curr, n)
  return prev, curr + n
end

-- remaining and reset (ns until both counts are gone).
local function sw_status(prev, curr, L, W, e)
  local remaining, reset = 0, 0
  if curr < L then
    local room = sw_room(prev, curr, L, W, e)
    if room > 0 then remaining = fdiv(room, W) end
  end
  if curr > 0 then reset = 2 * W - e
  elseif prev > 0 then reset = W - e end
  return remaining, reset
end

-- A refund (op 1) uncounts n permits from the current window, then from
-- the previous one; a penalty (op 2) counts them in the current one, up
-- to the limit.
local function sw_adjust(prev, curr, op, n, L)
  if op == 1 then
    if curr >= n then return prev, curr - n end
    n = n - curr
    if prev > n then return prev - n, 0 end
    return 0, 0
  end
  if n > L - curr then return prev, L end
  return prev, curr + n
end
