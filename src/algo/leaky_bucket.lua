-- SPDX-License-Identifier: MIT
-- Leaky bucket in Lua: the rule of leaky_bucket.c for the Redis scripts,
-- in the shape of the C table (rate__algo_t), its
-- members as local functions lb_NAME (as in leaky_bucket.c): load, advance, decide,
-- commit, adjust, and status (lb_remaining, lb_drain_time).  A driver
-- includes this file (cmake/lua_script.cmake) and turns bytes into
-- numbers around it.
--
-- v = level * P, in the driver's unit (divided by g in a lean script);
-- exact while the driver's gate keeps every number below 2^53
-- (LEAKY_BUCKET_STEP, LEAKY_BUCKET_LEAN).  Uses the driver's fdiv, cdiv.

-- A stored word (nil: a new key, an empty bucket) as a view; nil when
-- this library never writes it (below zero, above the capacity C * P).
local function lb_load(v, P, C)
  if v == nil then return 0 end
  if v < 0 or v > C * P then return nil end
  return v
end

-- The drain over dt (ns, or math.huge): v - dt * L, down to empty.
local function lb_advance(v, dt, L)
  if dt >= cdiv(v, L) then return 0 end
  return v - dt * L
end

-- ok, reason (0 ok, 1 limited, 2 never), delay, retry (-1: never).  A
-- request fits when the bucket has room for it and the queue ahead of it
-- drains within max_wait (with 0: only into an empty bucket).
local function lb_decide(v, n, L, P, C, max_wait)
  if n > C then return false, 2, 0, -1 end
  if n == 0 then return true, 0, 0, 0 end
  local drain = cdiv(v, L)
  if v + n * P <= C * P and drain <= max_wait then
    return true, 0, drain, 0
  end
  return false, 1, 0, drain
end

-- The word after admitting n.
local function lb_commit(v, n, P)
  return v + n * P
end

-- remaining (whole permits of room) and reset (ns until empty).
local function lb_status(v, L, P, C)
  local room, remaining = C * P - v, 0
  if room > 0 then remaining = fdiv(room, P) end
  return remaining, cdiv(v, L)
end

-- A refund (op 1) drains n permits, down to empty; a penalty (op 2)
-- pours them in, up to the capacity.
local function lb_adjust(v, op, n, P, C)
  if op == 1 then
    if n >= cdiv(v, P) then return 0 end
    return v - n * P
  end
  local cap = C * P
  if n > fdiv(cap - v, P) then return cap end
  return v + n * P
end
