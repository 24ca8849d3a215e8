-- @P1 = Bound, @P2 = Filter(0), @P3 = Filter(1)
SELECT COUNT_BIG(*) AS ESTIMATE FROM [app].[Item Log] AS T WHERE T.[Row Version] <= CAST(@P1 AS BINARY(8)) AND T.[Deleted At] IS NULL AND (T.[Body] IS NOT NULL AND T.[At] >= CONVERT(DATETIME2(7), @P2, 121) AND T.[Tenant] = CONVERT(VARCHAR(MAX), @P3 COLLATE Greek_100_CI_AS))
