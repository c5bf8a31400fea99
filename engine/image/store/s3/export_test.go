package s3

// OurLockForTest is the lock a dump by this process would write.
func OurLockForTest() Lock { return ourLock() }
