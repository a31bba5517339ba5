-- SPDX-License-Identifier: MIT
-- Token bucket in Lua: the rule of token_bucket.c and token_bucket.h, for
-- the Redis scripts, in the shape of the C table (rate__algo_t), its
-- members as local functions tb_NAME (as in token_bucket.c): load,
-- advance, decide, commit, adjust, and status (tb_remaining, tb_reset).
-- A driver includes this file (cmake/lua_script.cmake, docs/redis.md
-- "How the scripts are made") and turns bytes into numbers around it.
--
-- u = tokens * P.  Every number is in the driver's unit: a lean script
-- divides u, L and P by g (docs/redis.md, "Lean scripts"), the general
-- step does not.  Exact while the driver's gate keeps every number below
-- 2^53 (TOKEN_BUCKET_STEP, TOKEN_BUCKET_LEAN).  `debt` is how far below
-- zero a reservation may take u (2^62 scaled, in the driver's unit).
-- Uses the driver's fdiv and cdiv.

-- A stored word (nil: a new key, a full bucket) as a view; nil when this
-- library never writes it (more than the burst, a debt past `debt`).
local function tb_load(u, P, B, debt)
  if u == nil then return B * P end
  if u > B * P or -u > debt then return nil end
  return u
end

-- The refill over dt (ns, or math.huge): u + dt * L, up to B * P.
local function tb_advance(u, dt, L, P, B)
  local full = B * P
  if u < full then
    if dt >= cdiv(full - u, L) then return full end
    return u + dt * L
  end
  return u
end

-- ok, reason (0 ok, 1 limited, 2 never), delay, retry (-1: never).  A
-- reservation (max_wait > 0) waits for the missing tokens if they come in
-- time and the debt stays within `debt`.
local function tb_decide(u, n, L, P, B, max_wait, debt)
  if n > B then return false, 2, 0, -1 end
  local need = n * P
  if n == 0 or u >= need then return true, 0, 0, 0 end
  local late = cdiv(need - u, L)
  if max_wait > 0 and u - need >= -debt and late <= max_wait then
    return true, 0, late, 0
  end
  return false, 1, 0, late
end

-- The word after admitting n.
local function tb_commit(u, n, P)
  return u - n * P
end

-- remaining (whole tokens) and reset (ns until full) of a word.
local function tb_status(u, L, P, B)
  local remaining, reset = 0, 0
  if u > 0 then remaining = fdiv(u, P) end
  local missing = B * P - u
  if missing > 0 then reset = cdiv(missing, L) end
  return remaining, reset
end

-- A refund (op 1) adds n tokens, up to the burst; a penalty (op 2) takes
-- them, into debt as far as a reservation may go.  nil (declined) for a
-- penalty whose numbers would leave the exact range: more than lim (the
-- driver's NAME_LEAN or NAME_STEP) taken, or past the debt bound, which
-- the C step clamps instead.
local function tb_adjust(u, op, n, P, B, debt, lim)
  local full = B * P
  if op == 1 then
    if n >= cdiv(full - u, P) then return full end
    return u + n * P
  end
  if n > fdiv(lim, P) then return nil end
  local x = u - n * P
  if -x > debt then return nil end
  return x
end
