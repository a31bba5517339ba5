-- SPDX-License-Identifier: MIT
-- Fair shares on Redis, the script (docs/fair.md, "Redis (a fleet)"): one
-- not-waiting decision of a shared limit with fair shares in one round
-- trip, the store contract's fair() without the module.  A driver: the
-- shared limit is decided by the general step's pieces
-- (src/store/redis/step_*.lua, the algorithms' src/algo/*.lua), the fair
-- rule is src/fair/fair_rule.lua (the Lua twin of src/fair/step.c); the
-- shared state is written only when the fair rule lets the admission
-- stand.
--
-- KEYS[1]  the shared limit's key (as step.lua's), KEYS[2] its fair
--          table (a hash, the bytes in its field t; the same hash tag)
-- ARGV     step.lua's arguments, then six more: the flow's hash (8 bytes,
--          little-endian, not 0), its weight (1..2^20), a new table's
--          slots (1..4096), the fair period in microseconds (>= 1), and,
--          for a fair denial's retry estimate, the first limit's period
--          (ns) and limit
-- returns  step.lua's reply and two more: fair_denied (0/1), shared
--          (0/1); {0}: declined (nothing written: the client's table
--          decides); {2}: KEYS[1] is not a hash; {3}: KEYS[2] is not a
--          fair table (both left as they are); an error when KEYS[1] and
--          KEYS[2] are one key
--@include src/store/redis/step_lib.lua
--@include src/fair/rule.lua
--@include src/fair/fair_rule.lua
-- One key for both: refused, as RATELIMIT.FAIR refuses it (the table's
-- write would land in the shared limit's hash).
if KEYS[1] == KEYS[2] then
  return redis.error_reply('ERR fair: key and table are the same key')
end
local F_LIMIT = tonumber(table.remove(ARGV))
local F_PERIOD = tonumber(table.remove(ARGV))
local F_PERIOD_US = tonumber(table.remove(ARGV))
local F_SLOTS = tonumber(table.remove(ARGV))
local F_WEIGHT = tonumber(table.remove(ARGV))
local F_HASH = table.remove(ARGV)
if F_HASH == nil or #F_HASH ~= 8 or F_HASH == FAIR_ZERO8 or
   F_WEIGHT == nil or F_WEIGHT < 1 or F_WEIGHT > FAIR_ONE or
   F_WEIGHT % 1 ~= 0 or F_SLOTS == nil or F_SLOTS < 1 or F_SLOTS > 4096 or
   F_SLOTS % 1 ~= 0 or F_PERIOD_US == nil or F_PERIOD_US < 1 or
   F_PERIOD_US >= FAIR_TOP or F_PERIOD == nil or F_LIMIT == nil then
  return redis.error_reply('ERR fair: malformed arguments')
end
--@include src/store/redis/step_decide.lua
-- The request's time in microseconds: past 2^53 the client decides.
local f_now_us = now[1] * 1000000 + fdiv(now[2], 1000)
if f_now_us >= FAIR_TOP or n >= FAIR_ASKED_MAX then return DECLINE end
local f_got = redis.pcall('HGET', KEYS[2], 't')
if type(f_got) == 'table' and f_got.err ~= nil then
  if string.find(f_got.err, 'WRONGTYPE', 1, true) then return {3} end
  return redis.error_reply(f_got.err)
end
local T
if f_got then
  T = fair_read(f_got)
  if T == nil then return {3} end
else
  T = fair_new(F_SLOTS)
end
-- The rule's view of the shared limit (rule.h): its first limit's
-- algorithm, that limit and the fair period; past 2^50 the client
-- decides, as the module does.
if F_LIMIT >= FAIR_ASKED_MAX then return DECLINE end
for c = 1, count do
  if L[c] >= FAIR_ASKED_MAX then return DECLINE end
end
local f_kinds = {RULE_BUCKET, RULE_PACER, RULE_FIXED, RULE_LOG, RULE_COUNTER}
local f_sh = {limit = F_LIMIT, p = F_PERIOD_US, kind = f_kinds[A[1]]}
if f_sh.kind == nil then return DECLINE end
local f_ep = fdiv(f_now_us, F_PERIOD_US) + 1
local f_me, f_shared, f_total, f_light =
  fair_enter(T, F_HASH, F_WEIGHT, f_ep, n, f_sh, f_now_us, limit)
-- The rule: an admission that is not light stands only if the room left
-- keeps what the rule keeps (the light flows' and the flows' behind).
local f_denied = false
if allowed and reason == 0 then
  local need = fair_reserve(T, f_me, f_ep, f_total, limit, f_sh, f_now_us,
                            f_light)
  if remaining < need then
    f_denied, allowed, reason, delay = true, false, 1, 0
    remaining = remaining + n
    retry = math.ceil((need - (remaining - n)) * F_PERIOD / F_LIMIT)
    if retry >= 9223372036854775807 then retry = 9223372036854775807 end
  end
end
--@include src/store/redis/step_write.lua
if allowed and n > 0 then fair_charge(T, f_me, f_ep, n) end
redis.call('HSET', KEYS[2], 't', fair_bytes(T))
-- Kept three fair periods of the server's clock (at least a second):
-- an idle table's flows would all be back at V by then anyway; kept for
-- good when the shared limit's key is (ttl 0: the store's no_ttl).
if ttl_us == 0 then
  redis.call('PERSIST', KEYS[2])
else
  local f_ms = math.ceil(3 * F_PERIOD_US / 1000)
  if f_ms < 1000 then f_ms = 1000 end
  if f_ms > 1099511627776 then f_ms = 1099511627776 end
  redis.call('PEXPIRE', KEYS[2], string.format('%.0f', f_ms))
end
if retry == NEVER then retry = -1 end
return {1, allowed and 1 or 0, reason, comp, limit, remaining, delay, retry,
        reset, f_denied and 1 or 0, f_shared and 1 or 0}
