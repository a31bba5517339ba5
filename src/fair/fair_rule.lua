-- SPDX-License-Identifier: MIT
-- The fair rule over a fleet's table: src/fair/step.c in Lua, the same
-- bytes and answers (a piece of src/fair/fair.lua, after
-- src/store/redis/step_lib.lua, whose u32, put64 and fdiv it uses).
-- The table: a 32-byte header ('rfair' 1 0 0, slots, V, 0), then slots
-- entries of 48 bytes (hash as 8 bytes, s, epoch, asked_cur, asked_prev,
-- weight), every number a little-endian u64 below 2^53.  An entry no
-- decision changed is written back as the bytes it was read from.
local FAIR_MAGIC = 'rfair\1\0\0'
local FAIR_ZERO8 = string.rep('\0', 8)
local FAIR_ONE = 1048576 -- 2^20, a permit's service at weight 1
local FAIR_TOP = 9007199254740992 -- 2^53
local FAIR_LEAD = 17592186044416 -- 2^44
local FAIR_REBASE = 1099511627776 -- 2^40
local FAIR_ASKED_MAX = 1125899906842624 -- 2^50
local FAIR_NEED_MAX = 4503599627370496 -- 2^52
-- The most V or a flow's s can be (2^40 + 2^44, RATE__FAIR_S_MAX): past
-- it a table is refused, as the C rule refuses it (sums would round).
local FAIR_S_MAX = 18691697672192

local FAIR_ZERO48 = string.rep('\0', 48)

local function fair_num(s, i) -- a u64 below 2^53, else nil
  local lo, hi = u32(s, i), u32(s, i + 4)
  if hi >= 2097152 then return nil end
  return hi * 4294967296 + lo
end
-- The u64 at b[k..k+7] (bytes), below 2^53, else nil.
local function fair_at(b, k)
  local hi = b[k + 4] + b[k + 5] * 256 + b[k + 6] * 65536 + b[k + 7] * 16777216
  if hi >= 2097152 then return nil end
  return hi * 4294967296 + b[k] + b[k + 1] * 256 + b[k + 2] * 65536 +
         b[k + 3] * 16777216
end

-- The table's bytes into {slots, v, e = {...}}, each entry
-- {h, s, ep, cur, prev, w, raw} (raw: its bytes while unchanged; an
-- entry rewritten has dirty set); nil for bytes that are not a table the
-- rule could have written (as rate__fair_valid).
local function fair_read(str)
  if #str < 32 or str:sub(1, 8) ~= FAIR_MAGIC then return nil end
  local slots, v = fair_num(str, 9), fair_num(str, 17)
  if slots == nil or v == nil or slots < 1 or slots > 4096 or
     v > FAIR_S_MAX or #str ~= 32 + 48 * slots or
     str:sub(25, 32) ~= FAIR_ZERO8 then
    return nil
  end
  local e = {}
  for i = 0, slots - 1 do
    local o = 33 + 48 * i
    local raw = str:sub(o, o + 47)
    local x
    if raw == FAIR_ZERO48 then
      x = {h = FAIR_ZERO8, s = 0, ep = 0, cur = 0, prev = 0, w = 0, raw = raw}
    else
      local b = {string.byte(raw, 1, 48)}
      x = {h = raw:sub(1, 8), s = fair_at(b, 9), ep = fair_at(b, 17),
           cur = fair_at(b, 25), prev = fair_at(b, 33), w = fair_at(b, 41),
           raw = raw}
      if x.s == nil or x.ep == nil or x.cur == nil or x.prev == nil or
         x.w == nil or x.s > FAIR_S_MAX or x.cur > FAIR_ASKED_MAX or
         x.prev > FAIR_ASKED_MAX or
         (x.h ~= FAIR_ZERO8 and (x.w < 1 or x.w > FAIR_ONE)) then
        return nil
      end
    end
    e[i + 1] = x
  end
  return {slots = slots, v = v, e = e}
end

local function fair_new(slots)
  local e = {}
  for i = 1, slots do
    e[i] = {h = FAIR_ZERO8, s = 0, ep = 0, cur = 0, prev = 0, w = 0,
            raw = FAIR_ZERO48}
  end
  return {slots = slots, v = 0, e = e}
end

local function fair_bytes(T)
  local out = {FAIR_MAGIC, put64(T.slots), put64(T.v), FAIR_ZERO8}
  for i = 1, T.slots do
    local x = T.e[i]
    if x.dirty then
      out[#out + 1] = x.h .. put64(x.s) .. put64(x.ep) .. put64(x.cur) ..
                      put64(x.prev) .. put64(x.w)
    else
      out[#out + 1] = x.raw
    end
  end
  return table.concat(out)
end

local function fair_active(x, ep)
  return x.h ~= FAIR_ZERO8 and x.ep ~= 0 and x.ep + 1 >= ep
end

-- The least service of the active entries (nil: none).
local function fair_least(T, ep)
  local least = nil
  for i = 1, T.slots do
    local x = T.e[i]
    if fair_active(x, ep) and (least == nil or x.s < least) then
      least = x.s
    end
  end
  return least
end

-- The flow's entry (its index), counted at period ep; shared: it found
-- none of its own.  As rate__fair_enter.
local function fair_enter(T, hash, w, ep, n)
  local slots, v = T.slots, T.v
  local home = fdiv(u32(hash, 5) * slots, 4294967296)
  local probes = slots < 8 and slots or 8
  local k, free, me, shared = home, nil, nil, false
  for _ = 1, probes do
    local x = T.e[k + 1]
    if x.h == hash then x.w = w; x.dirty = true; me = k + 1; break end
    if free == nil and not fair_active(x, ep) then free = k + 1 end
    k = k + 1
    if k == slots then k = 0 end
  end
  if me == nil then
    if free == nil then
      me, shared = home + 1, true
    else
      me = free
      T.e[me] = {h = hash, s = v, ep = 0, cur = 0, prev = 0, w = w,
                 dirty = true}
    end
  end
  local x = T.e[me]
  x.dirty = true
  if x.ep ~= ep then
    local was = x.ep ~= 0 and x.ep + 1 >= ep
    if x.ep + 1 == ep then x.prev = x.cur else x.prev = 0 end
    x.cur = 0
    if not was and x.s < v then x.s = v end
    x.ep = ep
  end
  x.cur = x.cur + n
  if x.cur > FAIR_ASKED_MAX then x.cur = FAIR_ASKED_MAX end
  local least, total = nil, 0
  for i = 1, slots do
    local y = T.e[i]
    if fair_active(y, ep) then
      total = total + y.w
      if least == nil or y.s < least then least = y.s end
    end
  end
  if least ~= nil and least > v then T.v = least end
  return me, shared, total
end

-- The reserve of the active flows behind entry me for capacity cap: for
-- each, the least of its share floor(cap w / W), what it asked lately,
-- and its catch-up ceil((s_me - s) w / 2^20), each split so that every
-- product stays exact.  As rate__fair_reserve.
local function fair_reserve(T, me, ep, total, cap)
  local my = T.e[me].s
  if my <= T.v or total == 0 then return 0 end
  local need = 0
  local q = fdiv(cap, total)
  local r = cap - q * total
  for i = 1, T.slots do
    local x = T.e[i]
    if i ~= me and fair_active(x, ep) and x.s < my then
      local share = q * x.w + fdiv(r * x.w, total)
      local d = my - x.s
      local hi = fdiv(d, FAIR_ONE)
      local catch = hi * x.w + math.ceil((d - hi * FAIR_ONE) * x.w / FAIR_ONE)
      local term = x.cur > x.prev and x.cur or x.prev
      if share < term then term = share end
      if catch < term then term = catch end
      need = need + term
      if need > FAIR_NEED_MAX then need = FAIR_NEED_MAX end
    end
  end
  return need
end

-- n admitted permits charged to entry me.  As rate__fair_charge.
local function fair_charge(T, me, ep, n)
  local x = T.e[me]
  x.dirty = true
  local a = fdiv(n, x.w)
  local cost = FAIR_LEAD
  if a < 16777216 then
    cost = a * FAIR_ONE + cdiv((n - a * x.w) * FAIR_ONE, x.w)
    if cost > FAIR_LEAD then cost = FAIR_LEAD end
  end
  local top = T.v + FAIR_LEAD
  x.s = x.s + cost
  if x.s > top then x.s = top end
  local v = T.v
  local least = fair_least(T, ep)
  if least ~= nil and least > v then v = least end
  if v > FAIR_REBASE then
    for i = 1, T.slots do
      local y = T.e[i]
      if y.s > v then y.s = y.s - v else y.s = 0 end
      y.dirty = true
    end
    v = 0
  end
  T.v = v
end
