-- The UTC day of an epoch time in seconds, as YYYYMMDD. Redis's Lua has no os.date, so the
-- civil date is worked out from the day number (Howard Hinnant's days_from_civil, inverted).
local function utc_day(seconds)
  local z = math.floor(seconds / 86400) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
                          - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return string.format('%04d%02d%02d', y, m, d)
end
