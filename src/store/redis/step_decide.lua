-- SPDX-License-Identifier: MIT
-- The general step's decision (a piece of src/store/redis/step.lua and
-- src/store/redis/fair.lua, after step_lib.lua): the arguments and the key's
-- state read, every limit decided, the verdicts folded; nothing written.
-- A request it cannot decide exactly returns {0} (DECLINE) from the script.
local now, tm
if ARGV[1] == '' then
  tm = redis.call('TIME')
  now = {tonumber(tm[1]), tonumber(tm[2]) * 1000}
else
  now = {tonumber(ARGV[1]), tonumber(ARGV[2])}
end
local n = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local ttl_us = tonumber(ARGV[5])
local id = tonumber(ARGV[6])
local fmt = tonumber(ARGV[7])
local count = (#ARGV - 7) / 4
local L, P, B, A = {}, {}, {}, {}
for c = 1, count do
  A[c] = tonumber(ARGV[4 + 4 * c])
  L[c] = tonumber(ARGV[5 + 4 * c])
  P[c] = tonumber(ARGV[6 + 4 * c])
  B[c] = tonumber(ARGV[7 + 4 * c])
end
local DECLINE = {0}
if (fmt ~= 2 and fmt ~= 3) or id == nil or count < 1 or count % 1 ~= 0 then
  return DECLINE
end

-- Read the state (nil: a new key).
--@include src/store/redis/read_state.lua
local last = now
local view = {}
local off = 15
if st ~= nil then
  -- version byte: 2 or 3 (another is no format we know), and the request's
  if #st < 14 or string.byte(st, 14) ~= fmt then return DECLINE end
  last = get_t(st, 1)
  if last == nil or u32(st, 9) ~= id or string.byte(st, 13) ~= count then
    return DECLINE -- another policy (a tier change): the client converts
  end
end
local t = now
if tcmp(last, t) > 0 then t = last end
local dt = tdiff(t, last)

-- Load and advance each limit to t (spec: refill, drain, roll, prune).
-- Here the bytes become numbers; the rules are the pieces'.
for c = 1, count do
  local a, v = A[c], {}
  local have = st ~= nil
  if a == 1 then -- token bucket: u = tokens * P
    local x
    if have then
      if #st < off + 7 then return DECLINE end -- truncated
      x = i64(st, off, TOKEN_BUCKET_STEP); off = off + 8
      if x == nil then return DECLINE end
    end
    x = tb_load(x, P[c], B[c], DEBT)
    if x == nil then return DECLINE end
    v.x = tb_advance(x, dt, L[c], P[c], B[c])
  elseif a == 2 then -- leaky bucket: v = level * P
    local x
    if have then
      if #st < off + 7 then return DECLINE end
      x = u64(st, off, LEAKY_BUCKET_STEP); off = off + 8
      if x == nil then return DECLINE end
    end
    x = lb_load(x, P[c], B[c])
    if x == nil then return DECLINE end
    v.x = lb_advance(x, dt, L[c])
  elseif a == 3 then -- fixed window: the count of t_last's window
    if window(t, P[c]) == nil then return DECLINE end
    local x, same_w = nil, false
    if have then
      if #st < off + 7 then return DECLINE end
      x = u64(st, off, FIXED_WINDOW_STEP); off = off + 8
      if x == nil then return DECLINE end
      local k, ks = window(t, P[c]), window(last, P[c])
      if k == nil then return DECLINE end
      same_w = same(k, ks)
    end
    x = fw_load(x, L[c])
    if x == nil then return DECLINE end
    v.x = fw_advance(x, same_w)
  elseif a == 5 then -- sliding window counter: prev, curr
    if window(t, P[c]) == nil then return DECLINE end
    local x, y, roll = nil, nil, 0
    if have then
      if #st < off + 15 then return DECLINE end
      x = u64(st, off, SLIDING_WINDOW_STEP)
      y = u64(st, off + 8, SLIDING_WINDOW_STEP); off = off + 16
      if x == nil or y == nil then return DECLINE end
      local k, ks = window(t, P[c]), window(last, P[c])
      if k == nil then return DECLINE end
      if same(k, next_window(ks, P[c])) then roll = 1
      elseif not same(k, ks) then roll = 2 end
    end
    x, y = sw_load(x, y, L[c])
    if x == nil then return DECLINE end
    v.x, v.y = sw_advance(x, y, roll)
  elseif a == 4 then -- sliding log: entries (time, permits), their sum
    v, off = sl_load(st, off, L[c])
    if v == nil or not sl_advance(st, v, t, P[c]) then
      return DECLINE
    end
  else
    return DECLINE
  end
  view[c] = v
end
if st ~= nil and off ~= #st + 1 then return DECLINE end

-- Decide each limit: allowed, reason (0 ok, 1 limited, 2 never), delay,
-- retry, and remaining/reset now and after (the view with n admitted).
local NEVER = -1
local ver = {}
for c = 1, count do
  local a, v, r = A[c], view[c], {}
  if a == 1 then
    local u = v.x
    r.ok, r.reason, r.delay, r.retry =
      tb_decide(u, n, L[c], P[c], B[c], max_wait, DEBT)
    r.rem_now, r.reset_now = tb_status(u, L[c], P[c], B[c])
    if r.ok then
      r.new = tb_commit(u, n, P[c])
      r.rem_after, r.reset_after = tb_status(r.new, L[c], P[c], B[c])
    end
  elseif a == 2 then
    local lv = v.x
    r.ok, r.reason, r.delay, r.retry =
      lb_decide(lv, n, L[c], P[c], B[c], max_wait)
    r.rem_now, r.reset_now = lb_status(lv, L[c], P[c], B[c])
    if r.ok then
      r.new = lb_commit(lv, n, P[c])
      r.rem_after, r.reset_after = lb_status(r.new, L[c], P[c], B[c])
    end
  elseif a == 3 then
    local _, e = window(t, P[c])
    local to_next = P[c] - e
    r.ok, r.reason, r.delay, r.retry =
      fw_decide(v.x, n, L[c], to_next)
    r.rem_now, r.reset_now = fw_status(v.x, L[c], to_next)
    if r.ok then
      r.new = fw_commit(v.x, n)
      r.rem_after, r.reset_after = fw_status(r.new, L[c], to_next)
    end
  elseif a == 5 then
    local _, e = window(t, P[c])
    r.ok, r.reason, r.delay, r.retry =
      sw_decide(v.x, v.y, n, L[c], P[c], e)
    r.rem_now, r.reset_now = sw_status(v.x, v.y, L[c], P[c], e)
    if r.ok then
      local x, y = sw_commit(v.x, v.y, n)
      r.rem_after, r.reset_after = sw_status(x, y, L[c], P[c], e)
    end
  elseif a == 4 then
    r.ok, r.reason, r.delay, r.retry =
      sl_decide(st, v, n, L[c], P[c], t)
    if r.ok == nil then return DECLINE end
    r.rem_now, r.reset_now = sl_status(st, v, L[c], P[c], t, 0)
    if r.rem_now == nil then return DECLINE end
    if r.ok then
      r.rem_after, r.reset_after = sl_status(st, v, L[c], P[c], t, n)
    end
  end
  ver[c] = r
end

-- Fold (spec: all or nothing; smallest remaining, largest delay and reset,
-- largest retry among the denials).
local allowed, never = true, false
for c = 1, count do
  if not ver[c].ok then allowed = false end
  if ver[c].reason == 2 then never = true end
end
local reason = 0
if not allowed then if never then reason = 2 else reason = 1 end end
local remaining, delay, retry, reset, comp = nil, 0, 0, 0, -1
for c = 1, count do
  local r = ver[c]
  local rem, rs
  if allowed then rem, rs = r.rem_after, r.reset_after
  else rem, rs = r.rem_now, r.reset_now end
  if allowed and (remaining == nil or rem < remaining) then comp = c - 1 end
  if not allowed and not r.ok then
    -- as C compares unsigned retry values, NEVER (all ones) the largest
    local bigger = comp < 0 or
                   (retry ~= NEVER and (r.retry == NEVER or r.retry > retry))
    if bigger then comp = c - 1; retry = r.retry end
  end
  if remaining == nil or rem < remaining then remaining = rem end
  if r.delay > delay then delay = r.delay end
  if rs > reset then reset = rs end
end
if not allowed then delay = 0 end
if allowed then retry = 0 end
local limit = L[comp + 1]
if A[comp + 1] <= 2 then limit = B[comp + 1] end

