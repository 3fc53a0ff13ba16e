package lua

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestScriptsStartWithShebangAndHeader(t *testing.T) {
	for name, src := range map[string]string{"reconcile": Reconcile(), "ban": Ban(), "bucketban": BucketBan(), "take": Take(), "concurrency": Concurrency()} {
		if !strings.HasPrefix(src, "#!lua\n") {
			t.Errorf("%s: want a #!lua first line so Redis Cluster enforces declared keys", name)
		}
		if got := StripShebang(src); strings.HasPrefix(got, "#!") || !strings.HasPrefix(got, "-- ") {
			t.Errorf("%s: StripShebang left %q", name, got[:min(20, len(got))])
		}
	}
	if got, want := StripShebang("return 1"), "return 1"; got != want {
		t.Errorf("StripShebang(no shebang) = %q, want %q", got, want)
	}
	if got := StripShebang("#!lua"); got != "" {
		t.Errorf("StripShebang(only a shebang) = %q, want empty", got)
	}
}
