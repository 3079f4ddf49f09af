-- wrk script: every request is a streamed chat completion; a response counts as an error unless
-- it is HTTP 200, ends with "data: [DONE]" and carries no error frame.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"' .. (os.getenv("MODEL") or "qwen3-tiny") .. '","stream":true,' ..
  '"max_tokens":' .. (os.getenv("TOKENS") or "16") .. ',' ..
  '"messages":[{"role":"user","content":"Tell me about lighthouses."}]}'

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  bad = 0
  good = 0
end

function response(status, headers, body)
  if status == 200 and body:find("data: %[DONE%]") and not body:find('"error"') then
    good = good + 1
  else
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  local g, b = 0, 0
  for _, t in ipairs(threads) do
    g = g + t:get("good")
    b = b + t:get("bad")
  end
  io.write(string.format("complete streams: %d, bad streams: %d\n", g, b))
end
