-- Argo CD health of a headrace.dev Unload (resource.customizations.health.headrace.dev_Unload).
-- A one-shot operation: Ready=True once Completed (Healthy), phase Failed is Degraded,
-- every other phase (Pending, Sealing, ...) is Progressing.
local hs = {status = "Progressing", message = "Waiting for the operator to start the unload"}
if obj.status == nil then
  return hs
end
if obj.status.phase == "Failed" then
  hs.status = "Degraded"
end
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.type == "Ready" then
      hs.message = (c.reason or "") .. ": " .. (c.message or "")
      if c.status == "True" then
        hs.status = "Healthy"
      elseif c.reason == "Failed" then
        hs.status = "Degraded"
      end
      return hs
    end
  end
end
if obj.status.phase ~= nil then
  hs.message = "Phase " .. obj.status.phase
end
return hs
