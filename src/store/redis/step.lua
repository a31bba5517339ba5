-- SPDX-License-Identifier: MIT
-- The Redis store's one-round-trip step, the general script: the decision
-- of src/step.c, made inside Redis over the same state bytes.  A driver:
-- the algorithms' rules are src/algo/NAME.lua, which the build puts in
-- where the --@include lines say (cmake/lua_script.cmake); this file reads
-- the state's bytes into their numbers, folds their verdicts as
-- src/step.c does, and writes the state back.
--
-- Lua numbers are doubles, exact for integers below 2^53.  The client sends
-- this script only for policies whose products stay below each algorithm's
-- bound NAME_STEP, 2^50 (B*P, C*P, L*W and every count: rate__algo_t's
-- lua_step, which the build writes into the constants included first,
-- cmake/lua_range.cmake); here every number read from the state is checked
-- against its algorithm's bound as well.  Anything else -- a
-- larger value, a state made under another policy (a tier change) or in
-- another format, bytes that do not parse, a state that makes no sense --
-- returns {0}: the client then makes the decision itself through the
-- compare-and-set path, exactly (and its C step reports a state that makes
-- no sense as RATE_ECORRUPT).  So the script either answers exactly as C
-- does, or not at all; it never writes over a state it declined.
--
-- KEYS[1]  the key (a hash: v = version, s = state bytes)
-- ARGV     [1] [2] now as seconds and nanoseconds (both "" to use Redis's
--          TIME: one clock for the whole fleet), [3] permits, [4] max_wait
--          (ns), [5] ttl (0: no expiry, -1: this decision's reset_after,
--          else microseconds, rounded up; counted from Redis's TIME, see
--          expire_at), [6] policy id (the 32-bit tag of states made
--          under the policy), [7] format (the state's version byte: 2 the
--          first edition, whose tag is the policy's fingerprint, 3 the
--          second, whose tag is the store's policy id), then per limit
--          [4c+4] algorithm, [4c+5] L, [4c+6] P (or W), [4c+7] B
-- returns  {1, allowed, reason, component, limit, remaining, delay,
--           retry (-1: never), reset}; {0}: declined (nothing written), the
--           client decides; {2}: KEYS[1] is not a hash (WRONGTYPE): corrupt,
--           left as it is
--
-- A state read under the request's policy is checked field by field before
-- anything is decided (as the C step checks it): t_last below 2^63; a token
-- bucket's u <= B*P (and, a debt, >= -TOKEN_BUCKET_STEP here); a leaky bucket's
-- 0 <= v <= C*P; a fixed window's count <= L; a sliding window's prev and
-- curr <= L; a sliding log's length 8 + 16 * count and count <= sum <= L;
-- no bytes left over.  Any failure declines.  These checks take constant
-- time; a sliding log's entries are checked as src/algo/sliding_log.c
-- does, in two parts.  Every read touches only the entries it prunes (a
-- binary search, then their permits) and, for a denial, the ones its retry
-- passes and the newest: any of those out of range, or a running sum that
-- goes below zero, declines, so a tampered sum can only make a denial
-- stricter, never admit.  Only before an admission writes the log back are
-- the entries still in the window checked in full (each of 1..L permits,
-- times non-decreasing and <= t_last, their sum the pruned sum), as the C
-- step does; a failure declines (the C step reports RATE_ECORRUPT) and
-- nothing is written.
--
-- Times (up to 2^63 ns) are kept as {s, ns} pairs, exact; a difference of
-- two times is a number when below 2^50 ns (13 days), else math.huge,
-- which is as good: every bucket is full or empty by then, every window
-- gone.  Windows must divide a second or be whole seconds (1s, 250ms, 1m,
-- 1h, ...) for their edges to be found exactly; others are declined.
--@include lua_range.lua
local function fdiv(a, b) -- floor(a / b), 0 <= a < 2^51, 0 < b < 2^51
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) -- ceil(a / b), same ranges
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- Little-endian unsigned 64-bit (and 32-bit) integers from the state bytes;
-- nil when the value is lim (an algorithm's NAME_STEP, <= 2^52) or more.
-- A value past 2^53 rounds, but never to below lim: the comparison holds.
local function u32(s, i)
  local a, b, c, d = string.byte(s, i, i + 3)
  return a + b * 256 + c * 65536 + d * 16777216
end
local function u64(s, i, lim)
  local lo, hi = u32(s, i), u32(s, i + 4)
  local x = hi * 4294967296 + lo
  if x >= lim then return nil end
  return x
end
local function i64(s, i, lim) -- signed, -lim <= x < lim
  local lo, hi = u32(s, i), u32(s, i + 4)
  if hi < 2147483648 then
    local x = hi * 4294967296 + lo
    if x >= lim then return nil end
    return x
  end
  local m = (4294967295 - hi) * 4294967296 + (4294967296 - lo)
  if m > lim then return nil end -- below -lim
  return -m
end
-- `count` little-endian bytes of x (0 <= x < 2^53); with flip, each byte
-- complemented (255 - b), which writes -(x + 1) in two's complement.
local function le(x, count, flip)
  local t = {}
  for k = 1, count do
    local b = x % 256
    t[k] = string.char(flip and 255 - b or b)
    x = (x - b) / 256
  end
  return table.concat(t)
end
local function put64(x) return le(x, 8, false) end
local function put32(x) return le(x, 4, false) end
local function puti64(x) -- signed, |x| < 2^53
  if x < 0 then return le(-x - 1, 8, true) end
  return le(x, 8, false)
end

-- Times: {s, ns}.  From the 8 state bytes (nil at 2^63 or more), by long
-- division of four 16-bit limbs by 10^9; and back.
local E9 = 1000000000
local function get_t(str, i)
  local b = {string.byte(str, i, i + 7)}
  local limbs = {b[7] + b[8] * 256, b[5] + b[6] * 256, b[3] + b[4] * 256,
                 b[1] + b[2] * 256}
  if limbs[1] >= 32768 then return nil end
  local r, q = 0, 0
  for k = 1, 4 do
    local cur = r * 65536 + limbs[k]
    local d = fdiv(cur, E9)
    r = cur - d * E9
    q = q * 65536 + d
  end
  return {q, r}
end
local function put_t(t)
  local limbs, carry, x = {}, 0, t[1]
  for k = 1, 4 do
    local sl = x % 65536
    x = (x - sl) / 65536
    local cur = sl * E9 + carry
    limbs[k] = cur % 65536
    carry = (cur - limbs[k]) / 65536
  end
  carry = t[2]
  for k = 1, 4 do
    local cur = limbs[k] + carry
    limbs[k] = cur % 65536
    carry = (cur - limbs[k]) / 65536
  end
  local out = {}
  for k = 1, 4 do
    out[2 * k - 1] = string.char(limbs[k] % 256)
    out[2 * k] = string.char((limbs[k] - limbs[k] % 256) / 256)
  end
  return table.concat(out)
end
local function tcmp(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] and -1 or 1 end
  if a[2] ~= b[2] then return a[2] < b[2] and -1 or 1 end
  return 0
end
local function tdiff(a, b) -- a - b for a >= b: a number, or math.huge
  local ds = a[1] - b[1]
  if ds >= 1048576 then return math.huge end
  return ds * E9 + (a[2] - b[2])
end
local function tminus(a, d) -- a - d for d < 2^50; nil below zero
  local ds = fdiv(d, E9)
  local s, ns = a[1] - ds, a[2] - (d - ds * E9)
  if ns < 0 then ns = ns + E9; s = s - 1 end
  if s < 0 then return nil end
  return {s, ns}
end
-- The window holding t: {a, b} (compare both), and the offset e in it.
local function window(t, W)
  if W % E9 == 0 then
    local ws = W / E9
    local k = fdiv(t[1], ws)
    return {k, 0}, (t[1] - k * ws) * E9 + t[2]
  end
  if E9 % W == 0 then
    local j = fdiv(t[2], W)
    return {t[1], j}, t[2] - j * W
  end
  return nil
end
local function next_window(k, W)
  if W % E9 == 0 or k[2] + 1 == E9 / W then return {k[1] + 1, 0} end
  return {k[1], k[2] + 1}
end
local function same(a, b) return a[1] == b[1] and a[2] == b[2] end

-- The key expires no sooner than `us` microseconds after Redis's own
-- clock (TIME, a reply {s, us}), whatever clock the caller's decision went
-- by: PEXPIREAT at the end rounded up to whole milliseconds, plus one.
-- Redis drops a key once its millisecond clock (its microsecond clock
-- rounded down, or a snapshot taken earlier) is past the expiry, so the
-- rounding up alone keeps it to the end; the extra millisecond keeps it
-- there also where a server drops the key on reaching the expiry.  A
-- duration is at most 2^51 us (71 years): the sum stays exact.
local function expire_at(key, us, tm)
  if us > 2251799813685248 then us = 2251799813685248 end
  local e = tonumber(tm[1]) * 1000000 + tonumber(tm[2]) + us
  local ms = math.floor(e / 1000)
  if ms * 1000 > e then ms = ms - 1 elseif (ms + 1) * 1000 <= e then ms = ms + 1 end
  if ms * 1000 < e then ms = ms + 1 end
  redis.call('PEXPIREAT', key, string.format('%.0f', ms + 1))
end

-- The algorithms' rules (src/algo/NAME.lua: tb_load, tb_advance, ... in
-- the shape of the C tables), over the helpers above: the build puts each file's
-- text here (cmake/lua_script.cmake).
--@include src/algo/token_bucket.lua
--@include src/algo/leaky_bucket.lua
--@include src/algo/fixed_window.lua
--@include src/algo/sliding_window.lua
--@include src/algo/sliding_log.lua
-- A reservation's debt bound, 2^62 scaled tokens (RATE__DEBT_MAX): never
-- reached within TOKEN_BUCKET_STEP, as in C.
local DEBT = 4611686018427387904

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

-- Read the state (nil: a new key).  A key that is not a hash is no state
-- of ours: reported, never written.
local cur = redis.pcall('HMGET', KEYS[1], 'v', 's')
if cur.err ~= nil then
  if string.find(cur.err, 'WRONGTYPE', 1, true) then return {2} end
  return redis.error_reply(cur.err)
end
local st = cur[2]
-- a version that does not parse: the client reports it (its load, too,
-- reads the version first); then no version, version 0 or no state:
-- absent, as the client's load reads it
if cur[1] and (#cur[1] > 19 or not string.find(cur[1], '^%d+$')) then
  return DECLINE
end
if cur[1] == false or cur[1] == '0' or st == false then
  cur[1] = false
  st = nil
end
-- A version that cannot move on (2^63 - 1 or more, where HINCRBY stops: a
-- tampered key) starts again from TIME, as a new key's; the state stays.
local vtop = cur[1] and #cur[1] == 19 and cur[1] >= '9223372036854775807'
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

-- An admission with n >= 1 writes the new state, bumps the version and sets
-- the expiry; anything else writes nothing.  A log's entries still in the
-- window are checked in full first (sl_valid).
if allowed and n > 0 and st ~= nil then
  local llo, lhi = u32(st, 1), u32(st, 5)
  for c = 1, count do
    if A[c] == 4 and not sl_valid(st, view[c], llo, lhi) then
      return DECLINE
    end
  end
end
if allowed and n > 0 then
  local parts = {put_t(t), put32(id), string.char(count, fmt)}
  for c = 1, count do
    local a, v, r = A[c], view[c], ver[c]
    if a == 1 then parts[#parts + 1] = puti64(r.new)
    elseif a == 2 or a == 3 then parts[#parts + 1] = put64(r.new)
    elseif a == 5 then
      local x, y = sw_commit(v.x, v.y, n)
      parts[#parts + 1] = put64(x) .. put64(y)
    else parts[#parts + 1] = sl_commit(st, v, n, t) end
  end

  local state = table.concat(parts)
  -- One write: the version moves on (a new key's starts from TIME in
  -- microseconds, as the compare-and-set script's does) with the state.
  local ver
  if tm == nil and (cur[1] == false or vtop or ttl_us ~= 0) then
    tm = redis.call('TIME')
  end
  if cur[1] == false or vtop then
    ver = tm[1] * 1000000 + tm[2]
  else
    ver = tonumber(cur[1]) + 1
  end
  if ver ~= nil and ver < 2^53 then
    redis.call('HSET', KEYS[1], 'v', string.format('%.0f', ver), 's', state)
  else -- past exact doubles (never in practice): let Redis count
    redis.call('HINCRBY', KEYS[1], 'v', 1)
    redis.call('HSET', KEYS[1], 's', state)
  end
  -- ttl: 0 no expiry; -1 this decision's reset_after; else microseconds
  if ttl_us == 0 then
    redis.call('PERSIST', KEYS[1])
  else
    local us = ttl_us
    if us < 0 then us = cdiv(reset, 1000) end
    expire_at(KEYS[1], us, tm)
  end
end
if retry == NEVER then retry = -1 end
return {1, allowed and 1 or 0, reason, comp, limit, remaining, delay, retry, reset}
