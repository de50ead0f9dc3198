
function fmtBytes(b) {
  if (b == null || isNaN(b)) return "n/a";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Math.abs(b), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  let s = i === 0 ? v.toFixed(0) : (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
  if (s.indexOf(".") >= 0) s = s.replace(/0+$/, "").replace(/\.$/, "");
  return (b < 0 ? "-" : "") + s + " " + units[i];
}
