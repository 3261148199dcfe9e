package deps
import (
 _ "github.com/gin-gonic/gin"
 _ "github.com/redis/go-redis/v9"
 _ "gorm.io/gorm"
 _ "gorm.io/driver/mysql"
 _ "github.com/glebarez/sqlite"
 _ "github.com/alicebob/miniredis/v2"
 _ "github.com/go-redsync/redsync/v4"
 _ "github.com/go-redsync/redsync/v4/redis/goredis/v9"
 _ "github.com/golang-jwt/jwt/v5"
 _ "go.uber.org/goleak"
 _ "golang.org/x/sync/singleflight"
 _ "github.com/go-sql-driver/mysql"
)
