-- SPDX-License-Identifier: MIT
-- The fair rule over a fleet's table: src/fair/step.c in Lua, the same
-- bytes and answers (a piece of src/store/redis/fair.lua, after
-- src/store/redis/step_lib.lua, whose u32, put64 and fdiv it uses).
-- The table: a 112-byte header ('rfair' 2 0 0, slots, V, 0, the light
-- flows' estimator's 10 words), then slots entries of 72 bytes (hash as
-- 8 bytes, s, epoch, asked_cur, asked_prev, weight, gave, lsum, since),
-- every number a little-endian u64 below 2^53; a table of the first
-- format ('rfair' 1 0 0, 32 and 48 bytes) is read as one of these with
-- the added numbers 0.  An entry no decision changed is written back as
-- the bytes it was read from.  The rule's arithmetic is rule.lua's.
local FAIR_MAGIC = 'rfair\2\0\0'
local FAIR_MAGIC1 = 'rfair\1\0\0'
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
local FAIR_ZERO72 = string.rep('\0', 72)
local FAIR_LIGHT_MAX = 4503599627370496 -- 2^52

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

-- The table's bytes into {slots, v, l = the estimator, e = {...}}, each
-- entry {h, s, ep, cur, prev, w, gave, lsum, since, raw} (raw: its bytes
-- while unchanged; an entry rewritten has dirty set); nil for bytes that
-- are not a table the rule could have written (as rate__fair_valid, or
-- the first format's, as rate__fair_import).
local function fair_read(str)
  local v1 = str:sub(1, 8) == FAIR_MAGIC1
  if not v1 and str:sub(1, 8) ~= FAIR_MAGIC then return nil end
  local hdr, esz = 112, 72
  if v1 then hdr, esz = 32, 48 end
  if #str < hdr then return nil end
  local slots, v = fair_num(str, 9), fair_num(str, 17)
  if slots == nil or v == nil or slots < 1 or slots > 4096 or
     v > FAIR_S_MAX or #str ~= hdr + esz * slots or
     str:sub(25, 32) ~= FAIR_ZERO8 then
    return nil
  end
  local w = {}
  for k = 0, 9 do
    if v1 then
      w[k + 1] = 0
    else
      w[k + 1] = fair_num(str, 33 + 8 * k)
      if w[k + 1] == nil then return nil end
    end
  end
  local l = {q = w[1], t = w[2], bucket = w[3],
             peak = {w[4], w[5], w[6], w[7]}, ep = w[8], a_cur = w[9],
             a_prev = w[10]}
  local zero = v1 and FAIR_ZERO48 or FAIR_ZERO72
  local e = {}
  for i = 0, slots - 1 do
    local o = hdr + 1 + esz * i
    local raw = str:sub(o, o + esz - 1)
    local x
    if raw == zero then
      x = {h = FAIR_ZERO8, s = 0, ep = 0, cur = 0, prev = 0, w = 0, gave = 0,
           lsum = 0, since = 0, raw = raw}
    else
      local b = {string.byte(raw, 1, esz)}
      x = {h = raw:sub(1, 8), s = fair_at(b, 9), ep = fair_at(b, 17),
           cur = fair_at(b, 25), prev = fair_at(b, 33), w = fair_at(b, 41),
           gave = 0, lsum = 0, since = 0, raw = raw}
      if not v1 then
        x.gave, x.lsum, x.since = fair_at(b, 49), fair_at(b, 57), fair_at(b, 65)
        if x.gave == nil or x.lsum == nil or x.since == nil or
           x.gave > FAIR_LIGHT_MAX or x.lsum > FAIR_LIGHT_MAX or
           x.since > FAIR_LIGHT_MAX then
          return nil
        end
      end
      if x.s == nil or x.ep == nil or x.cur == nil or x.prev == nil or
         x.w == nil or x.s > FAIR_S_MAX or x.cur > FAIR_ASKED_MAX or
         x.prev > FAIR_ASKED_MAX or
         (x.h ~= FAIR_ZERO8 and (x.w < 1 or x.w > FAIR_ONE)) then
        return nil
      end
    end
    if v1 then x.dirty = true end -- written anew in this format
    e[i + 1] = x
  end
  return {slots = slots, v = v, l = l, e = e}
end

local function fair_new(slots)
  local e = {}
  for i = 1, slots do
    e[i] = {h = FAIR_ZERO8, s = 0, ep = 0, cur = 0, prev = 0, w = 0, gave = 0,
            lsum = 0, since = 0, raw = FAIR_ZERO72}
  end
  return {slots = slots, v = 0, e = e,
          l = {q = 0, t = 0, bucket = 0, peak = {0, 0, 0, 0}, ep = 0,
               a_cur = 0, a_prev = 0}}
end

local function fair_bytes(T)
  local l = T.l
  local out = {FAIR_MAGIC, put64(T.slots), put64(T.v), FAIR_ZERO8,
               put64(l.q), put64(l.t), put64(l.bucket), put64(l.peak[1]),
               put64(l.peak[2]), put64(l.peak[3]), put64(l.peak[4]),
               put64(l.ep), put64(l.a_cur), put64(l.a_prev)}
  for i = 1, T.slots do
    local x = T.e[i]
    if x.dirty then
      out[#out + 1] = x.h .. put64(x.s) .. put64(x.ep) .. put64(x.cur) ..
                      put64(x.prev) .. put64(x.w) .. put64(x.gave) ..
                      put64(x.lsum) .. put64(x.since)
    else
      out[#out + 1] = x.raw
    end
  end
  return table.concat(out)
end

-- The periods since the entry's flow first asked, ep included.
local function fair_age(x, ep)
  if x.since ~= 0 and ep >= x.since then return ep - x.since + 1 end
  return 0
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
-- none of its own; light: the request is light (rule.lua), the light
-- flows' estimator brought to now (us).  As rate__fair_enter.
local function fair_enter(T, hash, w, ep, n, sh, now, cap)
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
      T.e[me] = {h = hash, s = v, ep = 0, cur = 0, prev = 0, w = w, gave = 0,
                 lsum = 0, since = 0, dirty = true}
    end
  end
  local x = T.e[me]
  x.dirty = true
  if x.ep ~= ep then
    local was = x.ep ~= 0 and x.ep + 1 >= ep
    if x.ep + 1 == ep then x.prev = x.cur else x.prev = 0 end
    x.cur = 0
    if not was and x.s < v then x.s = v end
    if x.ep == 0 or ep < x.ep then
      x.lsum = 0
    else
      x.lsum = rule_long_decay(x.lsum, ep - x.ep)
    end
    if x.since == 0 or ep < x.since then x.since = ep end
    x.ep = ep
  end
  x.cur = x.cur + n
  if x.cur > FAIR_ASKED_MAX then x.cur = FAIR_ASKED_MAX end
  x.lsum = rule_long_add(x.lsum, n)
  local least, total = nil, 0
  for i = 1, slots do
    local y = T.e[i]
    if fair_active(y, ep) then
      total = total + y.w
      if least == nil or y.s < least then least = y.s end
    end
  end
  if least ~= nil and least > v then T.v = least end
  -- The light flows' estimator (as rate__fair_enter).
  rule_count(T.l, sh, now, n)
  local recent = x.cur > x.prev and x.cur or x.prev
  local light = rule_is_light(sh, recent, x.lsum, fair_age(x, ep), x.w,
                              total, cap)
  if light then
    rule_add(T.l, sh, n)
    x.gave = x.gave + n
    if x.gave > FAIR_LIGHT_MAX then x.gave = FAIR_LIGHT_MAX end
  elseif x.gave > 0 then
    local back = x.cur + x.prev
    if x.gave < back then back = x.gave end
    rule_take_back(T.l, sh, back)
    x.gave = 0
  end
  return me, shared, total, light
end

-- The room a request of entry me must leave (0 when it is light): the
-- light flows' reserve and the catch-up terms of the heavy flows behind
-- it.  As rate__fair_reserve.
local function fair_reserve(T, me, ep, total, cap, sh, now, light)
  if light then return 0 end
  local my = T.e[me].s
  local terms = 0
  if my > T.v and total > 0 then
    for i = 1, T.slots do
      local x = T.e[i]
      if i ~= me and fair_active(x, ep) and x.s < my then
        local asked = x.cur > x.prev and x.cur or x.prev
        if not rule_is_light(sh, asked, x.lsum, fair_age(x, ep), x.w, total,
                             cap) then
          terms = terms + rule_term(sh, now, cap, x.w, total, my - x.s, asked)
          if terms > FAIR_NEED_MAX then terms = FAIR_NEED_MAX end
        end
      end
    end
  end
  return rule_need(T.l, sh, now, cap, terms)
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
