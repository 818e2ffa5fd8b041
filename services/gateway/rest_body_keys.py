"""Unknown keys of a REST request's JSON body, refused at the public gateway naming the key.

Envoy's gRPC-JSON transcoder drops a body key that no field of the request has
(`imag` for `image`) and sends the call on, so a typo is silently ignored: its
library parses with unknown fields ignored, and no option of the filter
changes that (its `request_validation_options` cover methods, query
parameters and binding collisions only; unknown query parameters we already
refuse with `reject_unknown_query_parameters`). The frontend cannot see the
key either: the dropped key never reaches the gRPC message.

So a Lua filter runs before the transcoder on REST requests with a body. It
reads the JSON and walks it against the request message's fields, from a table
generated here from the descriptor set (json names and proto names, as the
transcoder accepts both; maps' keys are the user's; google.protobuf types are
leaves), and answers 400 INVALID_ARGUMENT with the key's path, the message
and the nearest field:

    jobs[0].imag: no such field in corral.batch.v1.JobSpec; did you mean "image"?

A body that is not valid JSON is left to the transcoder, which says so. The
Lua file is written beside the descriptor set (`lua_path`), as the OpenAPI
document is, by `descriptors.write_descriptor_set`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

F = descriptor_pb2.FieldDescriptorProto
LEAF_PREFIX = "google.protobuf."
"""Well-known types (Duration, Timestamp, Struct, ...): JSON of their own, not checked key by key."""


def lua_path(descriptor_set: Path) -> Path:
    """Where the Lua filter's source lies for a deployment whose descriptor set is `descriptor_set`."""
    return descriptor_set.with_name("rest_body_keys.lua")


@dataclasses.dataclass(frozen=True)
class BodyRoute:
    """A REST route whose body is (or holds) a message: its verb, its path as a Lua pattern, and what the body
    is ("M:type" a message, "S:type" a client stream of them, one or a JSON list)."""

    verb: str
    pattern: str
    want: str


def _messages(files: descriptor_pb2.FileDescriptorSet) -> dict[str, descriptor_pb2.DescriptorProto]:
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def walk(message: descriptor_pb2.DescriptorProto, prefix: str) -> None:
        name = f"{prefix}.{message.name}"
        found[name] = message
        for nested in message.nested_type:
            walk(nested, name)

    for file in files.file:
        for message in file.message_type:
            walk(message, file.package)
    return found


def _want(field: descriptor_pb2.FieldDescriptorProto, messages: dict[str, descriptor_pb2.DescriptorProto]
          ) -> str | None:
    """What a field's JSON value is to the walk: a message ("M:"), a list of them ("A:"), a map to them
    ("O:"), or None (a leaf: anything the transcoder itself checks)."""
    if field.type != F.TYPE_MESSAGE:
        return None
    name = field.type_name.lstrip(".")
    entry = messages[name]
    if entry.options.map_entry:
        value = next(f for f in entry.field if f.name == "value")
        inner = _want(value, messages)
        return f"O:{inner[2:]}" if inner is not None and inner.startswith("M:") else None
    if name.startswith(LEAF_PREFIX):
        return None
    return f"A:{name}" if field.label == F.LABEL_REPEATED else f"M:{name}"


@dataclasses.dataclass(frozen=True)
class MessageKeys:
    """The keys a message's JSON may have."""

    keys: dict[str, str | None]
    """Each key (json name and proto name, as the transcoder accepts both) and what its value is (`_want`)."""
    json_names: tuple[str, ...]
    """The names to suggest: the ones the JSON is written with."""


def field_table(files: descriptor_pb2.FileDescriptorSet, roots: list[str]) -> dict[str, MessageKeys]:
    """Every message reachable from `roots` and its keys."""
    messages = _messages(files)
    table: dict[str, MessageKeys] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in table or name.startswith(LEAF_PREFIX):
            continue
        keys: dict[str, str | None] = {}
        for field in messages[name].field:
            want = _want(field, messages)
            keys[field.json_name or field.name] = want
            keys[field.name] = want
            if want is not None:
                todo.append(want[2:])
        table[name] = MessageKeys(keys, tuple(f.json_name or f.name for f in messages[name].field))
    return table


def _path_pattern(template: str) -> str:
    """An HTTP rule's path template as an anchored Lua pattern: a variable is one segment without its verb."""
    parts = re.split(r"\{[^}]*\}", template)
    return "^" + "[^/:]+".join(re.sub(r"([%^$().\[\]*+\-?])", r"%\1", part) for part in parts) + "$"


def body_routes(files: descriptor_pb2.FileDescriptorSet) -> list[BodyRoute]:
    """Every REST route of the public services whose body is the request (`body: "*"`) or one of its
    message fields."""
    messages = _messages(files)
    routes = []
    for file in files.file:
        for service in file.service:
            for method in service.method:
                if not method.options.HasExtension(annotations_pb2.http):
                    continue
                rule = method.options.Extensions[annotations_pb2.http]
                request = method.input_type.lstrip(".")
                for binding in (rule, *rule.additional_bindings):
                    verb = binding.WhichOneof("pattern")
                    if verb is None or verb == "custom" or not binding.body:
                        continue
                    if binding.body == "*":
                        want: str | None = f"{'S' if method.client_streaming else 'M'}:{request}"
                    else:
                        field = next(f for f in messages[request].field if f.name == binding.body)
                        want = _want(field, messages)
                    if want is not None:
                        routes.append(BodyRoute(verb.upper(), _path_pattern(getattr(binding, verb)), want))
    return sorted(routes, key=lambda r: (r.verb, r.pattern))


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII names is a Lua string too


def lua_source(files: descriptor_pb2.FileDescriptorSet) -> str:
    """The Lua filter: the generated tables, then the walk (LUA_WALK)."""
    routes = body_routes(files)
    table = field_table(files, sorted({route.want[2:] for route in routes}))
    lines = ["-- Generated by services/gateway/rest_body_keys.py from the descriptor set: do not edit.",
             "local TYPES = {}"]
    for name in sorted(table):
        fields = ", ".join(f"[{_lua_string(key)}] = {_lua_string(want) if want else 'false'}"
                           for key, want in sorted(table[name].keys.items()))
        suggestions = ", ".join(_lua_string(key) for key in table[name].json_names)
        lines.append(f"TYPES[{_lua_string(name)}] = {{f = {{{fields}}}, s = {{{suggestions}}}}}")
    lines.append("local ROUTES = {")
    lines += [f"  {{{_lua_string(r.verb)}, {_lua_string(r.pattern)}, {_lua_string(r.want)}}}," for r in routes]
    lines.append("}")
    return "\n".join(lines) + "\n" + LUA_WALK


LUA_WALK = r'''
local MAX_DEPTH = 100  -- protobuf's own JSON nesting limit: deeper is the transcoder's to refuse

local function utf8_char(code)
  if code < 0x80 then return string.char(code) end
  if code < 0x800 then
    return string.char(0xC0 + math.floor(code / 0x40), 0x80 + code % 0x40)
  end
  if code < 0x10000 then
    return string.char(0xE0 + math.floor(code / 0x1000), 0x80 + math.floor(code / 0x40) % 0x40, 0x80 + code % 0x40)
  end
  return string.char(0xF0 + math.floor(code / 0x40000), 0x80 + math.floor(code / 0x1000) % 0x40,
                     0x80 + math.floor(code / 0x40) % 0x40, 0x80 + code % 0x40)
end

local ESCAPES = {['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t'}

-- The string starting at s[i] (a quote): its text, and the index after it.
local function read_string(s, i)
  local parts, j = {}, i + 1
  while true do
    local k = string.find(s, '["\\]', j)
    if not k then error("syntax") end
    parts[#parts + 1] = string.sub(s, j, k - 1)
    if string.byte(s, k) == 34 then return table.concat(parts), k + 1 end
    local c = string.sub(s, k + 1, k + 1)
    if c == "u" then
      local code = tonumber(string.sub(s, k + 2, k + 5), 16)
      if not code then error("syntax") end
      j = k + 6
      if code >= 0xD800 and code <= 0xDBFF and string.sub(s, j, j + 1) == "\\u" then
        local low = tonumber(string.sub(s, j + 2, j + 5), 16)
        if low and low >= 0xDC00 and low <= 0xDFFF then
          code, j = 0x10000 + (code - 0xD800) * 0x400 + (low - 0xDC00), j + 6
        end
      end
      parts[#parts + 1] = utf8_char(code)
    elseif ESCAPES[c] then
      parts[#parts + 1], j = ESCAPES[c], k + 2
    else
      error("syntax")
    end
  end
end

local function skip_space(s, i)
  return string.find(s, "[^ \t\r\n]", i) or error("syntax")
end

-- The JSON value at s[i], walked against `want` ("M:type", "A:type", "O:type", "S:type" or nil);
-- returns the index after it, or raises {key=, path=, type=} for a key no field has.
local function walk(s, i, want, path, depth)
  if depth > MAX_DEPTH then error("deep") end
  i = skip_space(s, i)
  local c = string.byte(s, i)
  local kind, name = nil, nil
  if want then kind, name = string.sub(want, 1, 1), string.sub(want, 3) end
  if c == 123 then  -- {
    local message = (kind == "M" or kind == "S") and TYPES[name] or nil
    i = skip_space(s, i + 1)
    if string.byte(s, i) == 125 then return i + 1 end
    while true do
      if string.byte(s, i) ~= 34 then error("syntax") end
      local key
      key, i = read_string(s, i)
      local at = (path == "") and key or (path .. "." .. key)
      local child = nil
      if message then
        child = message.f[key]
        if child == nil then error({key = key, path = at, type = name}) end
        if child == false then child = nil end
      elseif kind == "O" then
        child = "M:" .. name
      end
      i = skip_space(s, i)
      if string.byte(s, i) ~= 58 then error("syntax") end
      i = walk(s, i + 1, child, at, depth + 1)
      i = skip_space(s, i)
      local d = string.byte(s, i)
      if d == 125 then return i + 1 end
      if d ~= 44 then error("syntax") end
      i = skip_space(s, i + 1)
    end
  elseif c == 91 then  -- [
    local element = (kind == "A" or kind == "S") and ("M:" .. name) or nil
    i = skip_space(s, i + 1)
    if string.byte(s, i) == 93 then return i + 1 end
    local n = 0
    while true do
      i = walk(s, i, element, path .. "[" .. n .. "]", depth + 1)
      n = n + 1
      i = skip_space(s, i)
      local d = string.byte(s, i)
      if d == 93 then return i + 1 end
      if d ~= 44 then error("syntax") end
      i = i + 1
    end
  elseif c == 34 then
    local _, j = read_string(s, i)
    return j
  end
  local j = string.find(s, "[,%]} \t\r\n]", i) or (#s + 1)  -- a number, true, false or null
  if j == i then error("syntax") end
  return j
end

local function distance(a, b)
  local previous = {}
  for j = 0, #b do previous[j] = j end
  for i = 1, #a do
    local current = {[0] = i}
    for j = 1, #b do
      local cost = (string.byte(a, i) == string.byte(b, j)) and 0 or 1
      current[j] = math.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
    end
    previous = current
  end
  return previous[#b]
end

-- '; did you mean "image"?' for the nearest field (at most a third of the key's letters apart), or "".
local function nearest(key, type_name)
  if #key > 64 then return "" end
  local best, best_distance = nil, math.max(1, math.floor(#key / 3)) + 1
  for _, candidate in ipairs(TYPES[type_name].s) do
    local d = distance(string.lower(key), string.lower(candidate))
    if d < best_distance then best, best_distance = candidate, d end
  end
  return best and ('; did you mean "' .. best .. '"?') or ""
end

function envoy_on_request(handle)
  local headers = handle:headers()
  local verb = headers:get(":method")
  local path = headers:get(":path") or ""
  if (verb ~= "POST" and verb ~= "PUT" and verb ~= "PATCH") or string.sub(path, 1, 5) ~= "/api/" then return end
  if string.find(headers:get("content-type") or "", "grpc", 1, true) then return end
  path = string.match(path, "^[^?]*")
  local want = nil
  for _, route in ipairs(ROUTES) do
    if route[1] == verb and string.find(path, route[2]) then want = route[3] break end
  end
  if want == nil then return end
  local body = handle:body()
  if body == nil or body:length() == 0 then return end
  local ok, refusal = pcall(walk, body:getBytes(0, body:length()), 1, want, "", 0)
  if not ok and type(refusal) == "table" then
    -- The gateway's local replies make this text the message of a JSON google.rpc.Status (code 3).
    handle:respond({[":status"] = "400", ["content-type"] = "text/plain"},
                   refusal.path .. ": no such field in " .. refusal.type .. nearest(refusal.key, refusal.type))
  end
end
'''
