-- A line-level profile of seatgate's function library (ops/luaprof.sh runs
-- it): the library run by stock Lua 5.1 with a count hook on every VM
-- instruction and a call hook, redis.call forwarded to a real Redis over
-- a small RESP client, the calls replayed N times after 20 unmeasured
-- rounds. Redis's own redis-server has no symbols inside Lua, so this is
-- how the Lua side of ops/callgrind.sh's counts is split by line.
--   lua5.1 ops/luaprof.lua PORT LIBRARY_FILE CALLS_FILE N
-- CALLS_FILE: one FCALL a line, tab-separated: function, numkeys, keys,
-- args; '%I' in an argument becomes the round's number (a fresh session
-- or entry id each round).
local socket = require 'socket'
local cjson_mod = require 'cjson'
local port, libfile, callsfile, N = tonumber(arg[1]), arg[2], arg[3], tonumber(arg[4] or 100)
local conn = assert(socket.connect('127.0.0.1', port))
conn:setoption('tcp-nodelay', true)

local function send(args)
  local parts = {'*' .. #args .. '\r\n'}
  for i = 1, #args do
    local a = args[i]
    if type(a) == 'number' then a = string.format('%.17g', a) end
    parts[#parts + 1] = '$' .. #a .. '\r\n' .. a .. '\r\n'
  end
  assert(conn:send(table.concat(parts)))
end
local function read()
  local line = assert(conn:receive('*l'))
  local t, rest = line:sub(1, 1), line:sub(2)
  if t == '+' then return {ok = rest}
  elseif t == '-' then return {err = rest}
  elseif t == ':' then return tonumber(rest)
  elseif t == '$' then
    local n = tonumber(rest)
    if n < 0 then return false end
    local s = assert(conn:receive(n + 2))
    return s:sub(1, n)
  elseif t == '*' then
    local n = tonumber(rest)
    if n < 0 then return false end
    local a = {}
    for i = 1, n do a[i] = read() end
    return a
  end
  error('bad reply ' .. line)
end

local HOOK
local cmd_tally = {}
local function rcall_impl(raise, ...)
  debug.sethook()
  local args = {...}
  local info = debug.getinfo(3, 'Sl')
  local k = (info and info.currentline or 0) .. ' ' .. tostring(args[1])
  -- Arguments passed as Lua numbers, which Redis writes out with '%.17g'
  -- (printf's floating-point path: thousands of instructions each).
  local numbers = 0
  for i = 2, #args do
    if type(args[i]) == 'number' then numbers = numbers + 1 end
  end
  if numbers > 0 then k = k .. ' (' .. numbers .. ' as numbers)' end
  cmd_tally[k] = (cmd_tally[k] or 0) + 1
  send(args)
  local r = read()
  if HOOK then debug.sethook(HOOK, 'c', 1) end
  if raise and type(r) == 'table' and r.err then error(r.err) end
  return r
end
local FUNCS = {}
redis = {
  call = function(...) return rcall_impl(true, ...) end,
  pcall = function(...) return rcall_impl(false, ...) end,
  sha1hex = function() error('redis.sha1hex is not in the profiler: profile calls without a lease') end,
  error_reply = function(s) return {err = s} end,
  status_reply = function(s) return {ok = s} end,
  register_function = function(name, f) FUNCS[name] = f end,
  log = function() end, LOG_WARNING = 3,
}
cjson = cjson_mod

local code = io.open(libfile):read('*a'):gsub('^#![^\n]*\n', '')
local chunk = assert(loadstring(code, '=lib'))
chunk()

-- The calls: lines of "<function> <nkeys> args..." separated by \t
local calls = {}
for line in io.lines(callsfile) do
  local f = {}
  for field in (line .. '\t'):gmatch('([^\t]*)\t') do f[#f + 1] = field end
  calls[#calls + 1] = f
end

local function run(c, i)
  local name, nkeys = c[1], tonumber(c[2])
  local keys, args = {}, {}
  for j = 3, 2 + nkeys do keys[#keys + 1] = c[j] end
  for j = 3 + nkeys, #c do args[#args + 1] = (c[j]:gsub('%%I', tostring(i))) end
  return FUNCS[name](keys, args)
end

-- warm up (also checks the calls work)
for i = 1, 20 do for _, c in ipairs(calls) do run(c, 'w' .. i) end end

local vm, ccalls, fns = {}, {}, {}
HOOK = function(event)
  local info = debug.getinfo(2, 'Sln')
  if event == 'count' then
    if info.source == '=lib' then
      vm[info.currentline] = (vm[info.currentline] or 0) + 1
    end
  elseif event == 'call' then
    local caller = debug.getinfo(3, 'Sl')
    if caller and caller.source == '=lib' then
      local k = caller.currentline .. ' ' .. (info.what == 'C' and ('C:' .. tostring(info.name)) or ('L:' .. tostring(info.name) .. '@' .. info.linedefined))
      ccalls[k] = (ccalls[k] or 0) + 1
    end
  end
end
cmd_tally = {}
debug.sethook(HOOK, 'c', 1)
for i = 1, N do for _, c in ipairs(calls) do run(c, i) end end
debug.sethook()
HOOK = nil

local lines = {}
for l in code:gmatch('([^\n]*)\n') do lines[#lines + 1] = l end
local ncalls = N * #calls
local out = {}
local total = 0
for l, n in pairs(vm) do total = total + n; out[#out + 1] = {l, n} end
table.sort(out, function(a, b) return a[2] > b[2] end)
print(string.format('VM instructions per call: %.0f', total / ncalls))
for i = 1, math.min(60, #out) do
  local l, n = out[i][1], out[i][2]
  print(string.format('%6.1f  %5d  %s', n / ncalls, l, (lines[l] or ''):sub(1, 110)))
end
print('--- calls per call (C and Lua), by caller line')
local cs = {}
for k, n in pairs(ccalls) do cs[#cs + 1] = {k, n} end
table.sort(cs, function(a, b) return a[2] > b[2] end)
for i = 1, math.min(80, #cs) do
  local line = tonumber(cs[i][1]:match('^(%d+)'))
  print(string.format('%6.2f  %-40s %s', cs[i][2] / ncalls, cs[i][1], (lines[line] or ''):sub(1, 70)))
end
print('--- redis commands per call')
local ks = {}
for k, n in pairs(cmd_tally) do ks[#ks + 1] = {k, n} end
table.sort(ks, function(a, b) return a[2] > b[2] end)
for i = 1, #ks do print(string.format('%6.2f  %s', ks[i][2] / ncalls, ks[i][1])) end
