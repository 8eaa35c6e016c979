// Hudi's own bloom filter code (hudi-common, from the Hudi Spark bundle) applied to a base
// file's footer entries, for tests/test_bloom_filter.py. No Spark: `java -cp <bundle> ...`.
//
// Arguments: folders, one per base file, each holding
//   filter  the footer's org.apache.hudi.bloomfilter value
//   type    its hoodie_bloom_filter_type_code (SIMPLE when the footer has none)
//   keys    the file's record keys, one per line, each base64 of its UTF-8 bytes, in file order
//   absent  keys the file does not hold, the same way
// Prints, per folder, lines `<folder's position> <key>=<value>`:
//   answers     mightContain of the footer's filter for each key, then each absent key (1/0)
//   identical   whether the filter Java builds from the keys (write defaults of
//               HoodieStorageConfig, same type) serialises to exactly the footer's text
//   min, max    the least and greatest key in String.compareTo order, base64 of UTF-8
//   footer_keys the footer key names HoodieBloomFilterWriteSupport writes
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;

import org.apache.hudi.avro.HoodieBloomFilterWriteSupport;
import org.apache.hudi.common.bloom.BloomFilter;
import org.apache.hudi.common.bloom.BloomFilterFactory;
import org.apache.hudi.common.config.HoodieStorageConfig;

public class BloomFilterCheck {
  public static void main(String[] args) throws Exception {
    for (int i = 0; i < args.length; i++) {
      check(i, Paths.get(args[i]));
    }
  }

  private static void check(int n, Path dir) throws Exception {
    String text = Files.readString(dir.resolve("filter"), StandardCharsets.UTF_8);
    String type = Files.readString(dir.resolve("type"), StandardCharsets.UTF_8).trim();
    List<String> keys = lines(dir.resolve("keys"));
    List<String> absent = lines(dir.resolve("absent"));

    BloomFilter footer = BloomFilterFactory.fromString(text, type);
    StringBuilder answers = new StringBuilder();
    for (String k : keys) {
      answers.append(footer.mightContain(k) ? '1' : '0');
    }
    for (String k : absent) {
      answers.append(footer.mightContain(k) ? '1' : '0');
    }

    BloomFilter own = BloomFilterFactory.createBloomFilter(
        Integer.parseInt(HoodieStorageConfig.BLOOM_FILTER_NUM_ENTRIES_VALUE.defaultValue()),
        Double.parseDouble(HoodieStorageConfig.BLOOM_FILTER_FPP_VALUE.defaultValue()),
        Integer.parseInt(HoodieStorageConfig.BLOOM_FILTER_DYNAMIC_MAX_ENTRIES.defaultValue()),
        type);
    String min = null;
    String max = null;
    for (String k : keys) {
      own.add(k);
      if (min == null || k.compareTo(min) < 0) {
        min = k;
      }
      if (max == null || k.compareTo(max) > 0) {
        max = k;
      }
    }
    System.out.println(n + " answers=" + answers);
    System.out.println(n + " identical=" + own.serializeToString().equals(text));
    System.out.println(n + " default_type=" + HoodieStorageConfig.BLOOM_FILTER_TYPE.defaultValue());
    System.out.println(n + " min=" + (min == null ? "" : b64(min)));
    System.out.println(n + " max=" + (max == null ? "" : b64(max)));
    System.out.println(n + " footer_keys=" + String.join(",",
        HoodieBloomFilterWriteSupport.HOODIE_AVRO_BLOOM_FILTER_METADATA_KEY,
        HoodieBloomFilterWriteSupport.HOODIE_BLOOM_FILTER_TYPE_CODE,
        HoodieBloomFilterWriteSupport.HOODIE_MIN_RECORD_KEY_FOOTER,
        HoodieBloomFilterWriteSupport.HOODIE_MAX_RECORD_KEY_FOOTER));
  }

  private static List<String> lines(Path path) throws Exception {
    List<String> out = new ArrayList<>();
    for (String line : Files.readAllLines(path, StandardCharsets.US_ASCII)) {
      out.add(new String(Base64.getDecoder().decode(line), StandardCharsets.UTF_8));
    }
    return out;
  }

  private static String b64(String s) {
    return Base64.getEncoder().encodeToString(s.getBytes(StandardCharsets.UTF_8));
  }
}
