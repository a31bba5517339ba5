-- SPDX-License-Identifier: MIT
-- Fixed window in Lua: the rule of fixed_window.c for the Redis scripts,
-- in the shape of the C table (rate__algo_t), its
-- members as local functions fw_NAME (as in fixed_window.c): load, advance, decide,
-- commit, adjust, and status.  A driver includes this file
-- (cmake/lua_script.cmake) and finds the window around it: whether t is
-- in t_last's window, and to_next, the ns from t to the next window's
-- start (its time arithmetic is the driver's own).
--
-- cnt: the permits counted in t_last's window, at most L; exact while the
-- driver's gate keeps L and W below 2^53 (FIXED_WINDOW_STEP, _LEAN).

-- A stored count (nil: a new key) as a view; nil when this library never
-- writes it (below zero, past the limit).
local function fw_load(cnt, L)
  if cnt == nil then return 0 end
  if cnt < 0 or cnt > L then return nil end
  return cnt
end

-- The count at t: kept within t_last's window (same), else a new window's.
local function fw_advance(cnt, same)
  if same then return cnt end
  return 0
end

-- ok, reason (0 ok, 1 limited, 2 never), delay (always 0), retry (-1:
-- never; else the next window).
local function fw_decide(cnt, n, L, to_next)
  if n > L then return false, 2, 0, -1 end
  if n == 0 or cnt + n <= L then return true, 0, 0, 0 end
  return false, 1, 0, to_next
end

-- The count after admitting n.
local function fw_commit(cnt, n)
  return cnt + n
end

-- remaining and reset (ns until the count is gone: the next window, or 0
-- for an empty one).
local function fw_status(cnt, L, to_next)
  if cnt > 0 then return L - cnt, to_next end
  return L - cnt, 0
end

-- A refund (op 1) uncounts n permits from the current window, down to 0;
-- a penalty (op 2) counts them, up to the limit.
local function fw_adjust(cnt, op, n, L)
  if op == 1 then
    if cnt > n then return cnt - n end
    return 0
  end
  if n > L - cnt then return L end
  return cnt + n
end
