L=.devcarry/gtest/lib/libdsv41rt.so.0.1.0
cuobjdump -sass $L > $OUT/all.sass 2>&1
for f in a8_kernelILi1E decode_gemv_kernelILi1ELi1E; do
  awk -v pat="$f" '/Function : /{f = index($0, pat) > 0} f' $OUT/all.sass > $OUT/$f.sass
  echo "== $f: $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' $OUT/$f.sass) instructions"
  grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_]+(\.[A-Z0-9_.]+)?' $OUT/$f.sass | awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -25 | tr '\n' ' '; echo
done
