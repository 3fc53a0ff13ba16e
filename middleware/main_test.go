package middleware_test

import (
	"testing"

	"github.com/hybridrate/hybridrate/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }
