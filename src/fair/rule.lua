-- SPDX-License-Identifier: MIT
-- The fair rule's arithmetic: src/fair/rule.c in Lua, the same numbers
-- for the same inputs (a piece of src/store/redis/fair.lua, after
-- src/store/redis/step_lib.lua, whose fdiv and cdiv it uses).  Every
-- number stays below 2^53 (Lua's exact integers); where rule.c takes a
-- product in 128 bits, this computes it split so that each step is exact.
local RULE_MAX = 4503599627370496 -- 2^52: the estimator saturates here
local RULE_ONE = 1048576 -- 2^20
-- The kinds of rate__fair_kind_t.
local RULE_BUCKET, RULE_PACER, RULE_FIXED, RULE_COUNTER, RULE_LOG = 0, 1, 2, 3, 4

-- floor(a b / c) for a, b, c below 2^50 and b <= 2^20 or a b < 2^53.
local function rule_muldiv(a, b, c)
  local q = fdiv(a, c)
  local r = a - q * c
  return q * b + fdiv(r * b, c)
end

local function rule_sat(x)
  if x > RULE_MAX then return RULE_MAX end
  return x
end

-- What k periods of the same demand sum to in a long demand, in 2^20ths
-- of 8 periods' worth (rule.c's long_part; RULE_LONG[k + 1]).
local RULE_LONG = {0, 131072, 245760, 346112, 433920, 510752, 577980,
  636804, 688275, 733312, 772720, 807202, 837373, 863773, 886873, 907085,
  924771, 940246, 953787, 965635, 976002, 985073, 993010, 999955, 1006032,
  1011350, 1016003, 1020074, 1023636, 1026753, 1029480, 1031867, 1033955,
  1035782, 1037381, 1038780, 1040004, 1041075, 1042012, 1042832, 1043550,
  1044178, 1044727, 1045208, 1045629, 1045997, 1046319, 1046601, 1046847,
  1047063, 1047252, 1047417, 1047561, 1047687, 1047798, 1047895, 1047980,
  1048054, 1048119, 1048176, 1048226, 1048269, 1048307, 1048340, 1048369}

-- As rate__fair_is_light (age: the periods since the flow first asked).
local function rule_is_light(sh, asked, long_sum, age, w, total, cap)
  if total == 0 then return true end
  local share = rule_muldiv(sh.limit, w, total)
  if asked <= share + 1 then return true end
  if cap == 0 then cap = sh.limit end
  if age < 3 or asked > fdiv(cap, 2) then return false end
  if age > 64 then age = 64 end
  local a, b = 8 * (share + 1), RULE_LONG[age + 1]
  local q = fdiv(a, RULE_ONE)
  return long_sum <= q * b + fdiv((a - q * RULE_ONE) * b, RULE_ONE)
end

local function rule_long_add(sum, n)
  return rule_sat(sum + n)
end

local function rule_long_decay(sum, periods)
  local i = 0
  while i < periods and sum > 0 do
    if i == 64 then return 0 end
    local cut = fdiv(sum, 8)
    if sum < 8 then cut = cut + 1 end
    sum = sum - cut
    i = i + 1
  end
  return sum
end

local function rule_drain(l, sh, now)
  if now <= l.t then return end
  if sh.kind == RULE_FIXED then
    if fdiv(now, sh.p) ~= fdiv(l.t, sh.p) then l.q = 0 end
  elseif now - l.t >= fdiv(l.q, sh.limit) + 1 then
    l.q = 0
  else
    l.q = l.q - (now - l.t) * sh.limit
  end
  l.t = now
end

-- As rate__fair_light_count.
local function rule_count(l, sh, now, n)
  rule_drain(l, sh, now)
  local ep = fdiv(l.t, sh.p) + 1
  local b = fdiv(ep - 1, 8) + 1
  if b > l.bucket then
    local k = l.bucket + 1
    while k <= b and k <= l.bucket + 4 do
      l.peak[k % 4 + 1] = 0
      k = k + 1
    end
    l.bucket = b
  end
  if ep > l.ep then
    if ep == l.ep + 1 then l.a_prev = l.a_cur else l.a_prev = 0 end
    l.a_cur = 0
    l.ep = ep
  end
  l.a_cur = rule_sat(l.a_cur + n)
end

-- n permits times the period, saturating.
local function rule_scaled(n, p)
  if n > fdiv(RULE_MAX, p) then return RULE_MAX end
  return rule_sat(n * p)
end

local function rule_add(l, sh, n)
  local x = rule_scaled(n, sh.p)
  if x >= RULE_MAX - l.q then l.q = RULE_MAX else l.q = l.q + x end
  local k = l.bucket % 4 + 1
  if l.q > l.peak[k] then l.peak[k] = l.q end
end

local function rule_take_back(l, sh, n)
  local x = rule_scaled(n, sh.p)
  local k = l.bucket % 4 + 1
  if l.q > x then l.q = l.q - x else l.q = 0 end
  if l.peak[k] > x then l.peak[k] = l.peak[k] - x else l.peak[k] = 0 end
  if l.peak[k] < l.q then l.peak[k] = l.q end
end

-- As rate__fair_term.
local function rule_term(sh, now, cap, w, total, behind, asked)
  local share = rule_muldiv(cap, w, total)
  local hi = fdiv(behind, RULE_ONE)
  local catch = hi * w + cdiv((behind - hi * RULE_ONE) * w, RULE_ONE)
  local term = asked
  if share < term then term = share end
  if catch < term then term = catch end
  if sh.kind == RULE_FIXED then
    local s64 = fdiv(sh.p, 64)
    if s64 == 0 then s64 = 1 end
    local f = fdiv(sh.p - (now - fdiv(now, sh.p) * sh.p), s64)
    if f > 63 then f = 64 else f = f + 1 end
    local most = fdiv(asked, 64) * f + cdiv((asked % 64) * f, 64)
    if most < term then return most end
    return term
  end
  if sh.kind == RULE_BUCKET or sh.kind == RULE_PACER then return term end
  if term >= cdiv(asked, sh.limit) then return asked end
  return term * sh.limit
end

local function rule_light(l, sh, cap)
  if sh.kind == RULE_PACER then return 0 end
  local pk = 0
  for i = 1, 4 do if l.peak[i] > pk then pk = l.peak[i] end end
  local eighth = fdiv(cap, 8)
  if sh.kind == RULE_LOG then eighth = 0 end
  local r
  if pk >= l.q then
    r = eighth + cdiv(pk - l.q, sh.p)
  else
    local over = fdiv(l.q - pk, sh.p)
    if eighth > over then r = eighth - over else r = 0 end
  end
  if sh.kind == RULE_LOG and r > fdiv(sh.limit, 50) then
    r = fdiv(sh.limit, 50)
  end
  if r > cap then r = cap end
  return r
end

-- As rate__fair_need (terms: the sum of rule_term, below 2^52).
local function rule_need(l, sh, now, cap, terms)
  if cap == 0 then return 0 end
  local light = rule_light(l, sh, cap)
  if (sh.kind == RULE_FIXED or sh.kind == RULE_COUNTER) and light > 0 then
    local asks = l.a_prev
    if l.a_cur > asks then asks = l.a_cur end
    local k = fdiv(asks, 4 * light)
    if k == 0 then k = 1 end
    local slice = fdiv(sh.p, k)
    if slice < fdiv(sh.p, 256) then slice = fdiv(sh.p, 256) end
    if slice > fdiv(sh.p, 2) then slice = fdiv(sh.p, 2) end
    if sh.p - (now - fdiv(now, sh.p) * sh.p) <= slice then light = 0 end
  end
  if sh.kind == RULE_LOG or sh.kind == RULE_COUNTER then
    terms = cdiv(terms, sh.limit)
  end
  local need = light + terms
  if need > cap - 1 then need = cap - 1 end
  return need
end
