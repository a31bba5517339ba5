-- SPDX-License-Identifier: MIT
-- Fixed window, one limit: sent after redis_lean.lua (see there).  The
-- decision of src/algo/fixed_window.c: windows aligned to the clock's
-- zero, the count of t_last's window.  A time's offset in its window is
-- t mod W = (hi * 2^32 mod W + lo) mod W, the first by math.fmod (exact
-- for any doubles), the second by % corrected as fdiv does; t and
-- t_last share a window when t - t_last is the difference of their
-- offsets.  ARGV [10] L (at most FIXED_WINDOW_LEAN), [11] W (ns, below
-- it), as the client's gate (lean_of) sends them
local L, W = tonumber(ARGV[10]), tonumber(ARGV[11])
if L > FIXED_WINDOW_LEAN or W >= FIXED_WINDOW_LEAN then return DECLINE end
local function offset(hi, lo)
  local r = (math.fmod(hi * E32, W) + lo) % W -- below 2^53: exact but for
  if r < 0 then r = r + W elseif r >= W then r = r - W end -- one W
  return r
end
local e = offset(t_hi, t_lo)
local cnt = 0
if st ~= nil then
  cnt = w8
  if cnt == nil or cnt < 0 or cnt > L then return DECLINE end
  if dt ~= e - offset(l_hi, l_lo) then cnt = 0 end
end
local to_next = W - e
if OP ~= '0' then
  -- fw_adjust: a refund uncounts n permits from the current window (none
  -- once it has rolled), a penalty counts them, up to the limit.
  local x
  if OP == '1' then
    if cnt > n then x = cnt - n else x = 0 end
  else
    if n > L - cnt then x = L else x = cnt + n end
  end
  local reset = 0
  if x > 0 then reset = to_next end
  write(word_out(x, 1), reset)
  return {1, 1, 0, 0, L, L - x, 0, 0, reset}
end
local ok, reason, retry = false, 0, 0
if n > L then reason = 2; retry = -1
elseif n == 0 or cnt + n <= L then ok = true
else reason = 1; retry = to_next end
local x = cnt
if ok then x = cnt + n end
local reset = 0
if x > 0 then reset = to_next end
if ok and n > 0 then write(word_out(x, 1), reset) end
return {1, ok and 1 or 0, reason, 0, L, L - x, 0, retry, reset}
